# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
in_channels = 8
out_channels = 64
height = 256
width = 256
in_features = 12
out_features = 16


class Model(nn.Module):
    """A KernelBench-style chain (see forward)."""

    def __init__(self, in_channels, out_channels, in_features, out_features):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.act = nn.SiLU()
        self.t = nn.Tanh()
        self.s = nn.Sigmoid()
        self.ls = nn.LogSoftmax(dim=1)

    def forward(self, x):
        x = self.ls(self.s(self.t(self.act(self.conv(x)))))
        return x


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, in_features, out_features]
