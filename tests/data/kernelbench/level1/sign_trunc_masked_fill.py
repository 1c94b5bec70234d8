# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import torch
import torch.nn as nn

batch_size = 4096
dim1 = 384
dim2 = 1024


class Model(nn.Module):
    """sign, trunc, frac, clamp_min/clamp_max/clip, torch.special.expit, masked_fill and nan_to_num."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x):
        y = torch.sign(x) * torch.trunc(x * 3) + x.frac()
        y = torch.clamp_min(y, -2.0) + x.clamp_max(0.5) + torch.clip(x, -0.25, 0.25)
        y = y.masked_fill(x < -1.0, 0.125) * torch.special.expit(x)
        return torch.nan_to_num(torch.log(y), nan=0.5, neginf=-7.0)  # log of y <= 0: NaN, -inf


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2) * 2]


def get_init_inputs():
    return []
