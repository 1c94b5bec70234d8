import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
dim1 = 4096
dim2 = 4095
dim = 1


class Model(nn.Module):
    """Min over a dimension (values of torch.min)."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.min(x, dim=self.dim)[0]


def get_inputs():
    return [torch.rand(batch_size, dim1, dim2)]


def get_init_inputs():
    return [dim]
