# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 64
in_channels = 64
out_channels = 128
height, width = 10, 9
in_features = 12
out_features = 16
length = 65536


class Model(nn.Module):
    """A KernelBench-style chain (see forward)."""

    def __init__(self, in_channels, out_channels, in_features, out_features):
        super(Model, self).__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, 3)
        self.bn = nn.BatchNorm1d(out_channels)
        self.pool = nn.MaxPool1d(2)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return x


def get_inputs():
    return [torch.rand(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, in_features, out_features]
