# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import torch
import torch.nn as nn

batch_size = 128
in_channels = 16
out_channels = 64
height = 256
width = 256
kernel_size = 3
ceiling = 0.75
floor_value = -0.25
negative_fill = 0.05


class Model(nn.Module):
    """Convolution, then tensor constants made in forward: ``torch.tensor`` with and without
    ``device=x.device`` / ``dtype=x.dtype``, in min / max / arithmetic / where."""

    def __init__(self, in_channels, out_channels, kernel_size, ceiling, floor_value, negative_fill):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)
        self.ceiling = ceiling
        self.floor_value = floor_value
        self.negative_fill = negative_fill

    def forward(self, x):
        x = self.conv(x)
        x = torch.min(x, torch.tensor(self.ceiling, device=x.device))
        x = torch.max(torch.tensor(self.floor_value), x)
        x = x * torch.tensor(1.5, dtype=x.dtype, device=x.device) - torch.tensor(0.125)
        x = torch.where(x > 0, x, torch.tensor(self.negative_fill, device=x.device))
        return x


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, ceiling, floor_value, negative_fill]
