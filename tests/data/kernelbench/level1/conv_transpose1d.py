import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 64
in_channels = 128
out_channels = 128
kernel_size = 3
length = 65536


class Model(nn.Module):
    """Transposed 1-D convolution with stride and padding."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.rand(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
