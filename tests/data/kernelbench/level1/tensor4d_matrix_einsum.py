import torch
import torch.nn as nn

b = 8
i = 64
j = 64
l = 128
k = 96


class Model(nn.Module):
    """4-D tensor times matrix through einsum."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.einsum("bijl,lk->bijk", A, B)


def get_inputs():
    return [torch.randn(b, i, j, l), torch.randn(l, k)]


def get_init_inputs():
    return []
