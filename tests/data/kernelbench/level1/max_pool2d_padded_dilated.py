# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import torch
import torch.nn as nn

batch_size = 32
channels = 64
height = 512
width = 512
kernel_size = 2
stride = 2
padding = 1
dilation = 3


class Model(nn.Module):
    """Simple model that performs Max Pooling 2D."""

    def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
        super(Model, self).__init__()
        self.maxpool = nn.MaxPool2d(kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool(x)


def get_inputs():
    x = torch.rand(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return [kernel_size, stride, padding, dilation]
