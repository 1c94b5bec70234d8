import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
channels = 64
height = 2048
width = 1023
kernel_size = 11


class Model(nn.Module):
    """Average pooling 2-D."""

    def __init__(self, kernel_size):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size)

    def forward(self, x):
        return self.pool(x)


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return [kernel_size]
