import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
dim1 = 256
dim2 = 256


class Model(nn.Module):
    """Softmax over the middle dimension of a 3-D tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return []
