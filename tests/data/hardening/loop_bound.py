"""A problem whose size constant is set inside a loop: it cannot be overridden soundly."""

import torch
import torch.nn as nn

N = 8
for N in (16, 32):
    pass


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.rand(N)]


def get_init_inputs():
    return []
