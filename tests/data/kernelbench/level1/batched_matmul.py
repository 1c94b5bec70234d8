import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
m = 512
k = 1024
n = 2048


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
