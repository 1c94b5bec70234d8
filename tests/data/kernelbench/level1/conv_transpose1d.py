import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
in_channels = 32
out_channels = 64
kernel_size = 5
length = 256


class Model(nn.Module):
    """Transposed 1-D convolution with stride and padding."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
