"""problem=vector_add shape N=2048 expect=correct
Uses numpy only for shape arithmetic (np.prod of the shape, np.int32 for the size argument)."""
import numpy as np
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        n = int(np.prod(a.shape))
        c = torch.empty_like(a)
        groups = int(np.ceil(n / 64))
        self.k.add(a, b, c, np.int32(n), grid=(max(1, groups),), block=(64,))
        return c
