# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 1024
in_channels = 3
out_channels = 16
height = 64
width = 64
in_features = 12
out_features = 16
depth = 16


class Model(nn.Module):
    """A KernelBench-style chain (see forward)."""

    def __init__(self, in_channels, out_channels, in_features, out_features):
        super(Model, self).__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(2, out_channels)

    def forward(self, x):
        x = self.gn(self.conv(x))
        x = x.mean(dim=[1, 2, 3, 4])
        return x


def get_inputs():
    return [torch.rand(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, in_features, out_features]
