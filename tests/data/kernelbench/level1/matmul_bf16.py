import torch
import torch.nn as nn

M = 4096
K = 2048
N = 6144


class Model(nn.Module):
    """Rectangular matrix multiply in bfloat16 (C = A @ B, bf16 in and out)."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
