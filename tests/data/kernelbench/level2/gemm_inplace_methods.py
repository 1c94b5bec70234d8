# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import torch
import torch.nn as nn

batch_size = 8192
in_features = 4096
out_features = 4096
scale = 0.5
shift = -0.25
floor_value = -1.5


class Model(nn.Module):
    """Linear, then in-place tensor methods and functions on its output (``mul_``, ``add_``,
    ``clamp_min_``, ``torch.sigmoid_``); the tensor read after ``tanh_`` is the one it wrote."""

    def __init__(self, in_features, out_features, scale, shift, floor_value):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale
        self.shift = shift
        self.floor_value = floor_value

    def forward(self, x):
        x = self.linear(x)
        x.mul_(self.scale).add_(self.shift)
        x.clamp_min_(self.floor_value)
        y = x.tanh_()
        z = torch.sigmoid_(y * 3.0)
        return x + z


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale, shift, floor_value]
