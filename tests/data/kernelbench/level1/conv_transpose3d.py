import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
in_channels = 16
out_channels = 16
kernel_size = 3
depth = 16
width = 32
height = 32


class Model(nn.Module):
    """Transposed 3-D convolution."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
