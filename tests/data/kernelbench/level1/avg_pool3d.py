import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16
channels = 32
depth = 128
height = 128
width = 255
kernel_size = 3
stride = 2
padding = 1


class Model(nn.Module):
    """Average pooling 3-D with padding."""

    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.pool = nn.AvgPool3d(kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.pool(x)


def get_inputs():
    return [torch.rand(batch_size, channels, depth, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding]
