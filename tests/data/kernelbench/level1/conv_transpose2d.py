import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
in_channels = 64
out_channels = 64
width = 1024
height = 1024


class Model(nn.Module):
    """Transposed 2-D convolution, grouped, asymmetric."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.ConvTranspose2d(in_channels, out_channels, (3, 4), stride=(2, 1), padding=(1, 0), groups=2, dilation=(1, 2))

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
