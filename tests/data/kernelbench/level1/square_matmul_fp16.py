import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    """Square matrix multiply in half precision (C = A @ B, fp16 in and out)."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(N, N, dtype=torch.float16), torch.randn(N, N, dtype=torch.float16)]


def get_init_inputs():
    return []
