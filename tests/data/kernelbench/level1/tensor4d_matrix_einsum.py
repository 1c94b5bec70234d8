import torch
import torch.nn as nn

b = 8
i = 256
j = 512
l = 256
k = 768


class Model(nn.Module):
    """4-D tensor times matrix through einsum."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.einsum("bijl,lk->bijk", A, B)


def get_inputs():
    return [torch.rand(b, i, j, l), torch.rand(l, k)]


def get_init_inputs():
    return []
