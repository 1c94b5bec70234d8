# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
in_channels = 16
out_channels = 32
height = 32
width = 32
in_features = 12
out_features = 16
depth = 16


class Model(nn.Module):
    """A KernelBench-style chain (see forward)."""

    def __init__(self, in_channels, out_channels, in_features, out_features):
        super(Model, self).__init__()
        self.conv = nn.ConvTranspose3d(in_channels, out_channels, 3, stride=2, groups=2)

    def forward(self, x):
        x = F.hardswish(self.conv(x))
        x = F.max_pool3d(x, 2)
        return x


def get_inputs():
    return [torch.rand(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, in_features, out_features]
