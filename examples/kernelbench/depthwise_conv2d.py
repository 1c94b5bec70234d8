import torch
import torch.nn as nn

batch_size = 4
channels = 8
height = 64
width = 64
kernel_size = 3


class Model(nn.Module):
    """Depthwise 2-D convolution (square kernel, stride 1, no padding, no bias)."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, groups=channels, bias=False)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size]
