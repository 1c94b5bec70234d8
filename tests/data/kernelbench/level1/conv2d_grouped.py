import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
in_channels = 64
out_channels = 128
groups = 4
kernel_size = 3
width = 512
height = 512


class Model(nn.Module):
    """Grouped 2-D convolution."""

    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1, groups=groups)

    def forward(self, x):
        return self.conv2d(x)


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
