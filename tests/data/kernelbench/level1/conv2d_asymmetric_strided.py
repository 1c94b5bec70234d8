import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
in_channels = 64
out_channels = 128
width = 256
height = 512


class Model(nn.Module):
    """2-D convolution, asymmetric kernel, stride, padding and dilation."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1))

    def forward(self, x):
        return self.conv2d(x)


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
