"""A KernelBench-style problem whose bias shape is derived from a size constant."""

import torch
import torch.nn as nn

batch_size = 2
out_channels = 8
height = 4
width = 4
bias_shape = (out_channels, 1, 1)


class Model(nn.Module):
    """Adds a learned per-channel bias."""

    def __init__(self, bias_shape):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return x + self.bias


def get_inputs():
    return [torch.rand(batch_size, out_channels, height, width)]


def get_init_inputs():
    return [bias_shape]
