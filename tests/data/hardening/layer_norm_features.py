"""A KernelBench-style layer norm whose normalized shape is derived from ``features``."""

import torch
import torch.nn as nn

batch_size = 4
features = 16
dim1 = 8
normalized_shape = (features, dim1)


class Model(nn.Module):
    """Layer normalisation over the last two dimensions."""

    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.rand(batch_size, features, dim1)]


def get_init_inputs():
    return [normalized_shape]
