# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import torch
import torch.nn as nn

M = 32768
N = 32


class Model(nn.Module):
    """Simple model that performs a single matrix multiplication (C = A * B) where one of the matrices is tall and skinny (M >> N or N >> M)."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    A = torch.rand(M, N)
    B = torch.rand(N, M)
    return [A, B]


def get_init_inputs():
    return []  # No special initialization inputs needed
