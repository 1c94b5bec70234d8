# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
in_channels = 3
out_channels = 8
height, width = 10, 9
in_features = 1024
out_features = 16
seq_len = 512


class Model(nn.Module):
    """A KernelBench-style chain (see forward)."""

    def __init__(self, in_channels, out_channels, in_features, out_features):
        super(Model, self).__init__()
        self.q = nn.Linear(in_features, in_features)
        self.k = nn.Linear(in_features, in_features)

    def forward(self, x):
        q, k = self.q(x), self.k(x)
        a = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        x = torch.matmul(F.softmax(a, dim=-1), x)
        return x


def get_inputs():
    return [torch.rand(batch_size, seq_len, in_features)]


def get_init_inputs():
    return [in_channels, out_channels, in_features, out_features]
