import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 64
features = 192
length = 65536
kernel_size = 8
stride = 1
padding = 4
dilation = 3


class Model(nn.Module):
    """Max pooling 1-D with dilation."""

    def __init__(self, kernel_size, stride, padding, dilation):
        super().__init__()
        self.pool = nn.MaxPool1d(kernel_size, stride=stride, padding=padding, dilation=dilation)

    def forward(self, x):
        return self.pool(x)


def get_inputs():
    return [torch.rand(batch_size, features, length)]


def get_init_inputs():
    return [kernel_size, stride, padding, dilation]
