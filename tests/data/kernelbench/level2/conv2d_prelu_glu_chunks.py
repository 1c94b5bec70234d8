# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import torch
import torch.nn as nn

batch_size = 128
in_channels = 16
out_channels = 64
height = 256
width = 256


class Model(nn.Module):
    """Convolution, then activation modules the cookbook has as functions (nn.PReLU per channel,
    nn.Hardshrink, nn.CELU, nn.GLU), a chunk and an unbind picked by index, movedim and a
    ``.to(x.dtype)`` of a comparison."""

    def __init__(self, in_channels, out_channels):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.prelu = nn.PReLU(out_channels)
        self.shrink = nn.Hardshrink(0.2)
        self.celu = nn.CELU(0.8)
        self.glu = nn.GLU(dim=1)

    def forward(self, x):
        x = self.conv(x)
        y = self.prelu(x) + self.shrink(x) - self.celu(x)
        g = self.glu(y)
        first = torch.chunk(y, 2, dim=1)[0]
        last = y.unbind(1)[5].unsqueeze(1)
        mask = (g > 0).to(x.dtype)
        z = (g + first) * mask + last
        return torch.movedim(z, 1, -1).contiguous()


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
