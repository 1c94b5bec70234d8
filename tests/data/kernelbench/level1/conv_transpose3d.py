import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
in_channels = 48
out_channels = 48
kernel_size = 3
depth = 64
width = 64
height = 64


class Model(nn.Module):
    """Transposed 3-D convolution."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.rand(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
