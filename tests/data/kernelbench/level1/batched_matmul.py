import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
m = 256
k = 512
n = 384


class Model(nn.Module):
    """Batched matrix multiply (bmm)."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.bmm(A, B)


def get_inputs():
    return [torch.rand(batch_size, m, k), torch.rand(batch_size, k, n)]


def get_init_inputs():
    return []
