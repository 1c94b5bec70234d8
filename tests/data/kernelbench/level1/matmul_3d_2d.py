import torch
import torch.nn as nn
import torch.nn.functional as F

N = 16
M = 1024
K = 2048
L = 768


class Model(nn.Module):
    """3-D tensor times matrix."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.rand(N, M, K), torch.rand(K, L)]


def get_init_inputs():
    return []
