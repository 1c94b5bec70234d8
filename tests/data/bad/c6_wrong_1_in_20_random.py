"""problem=vector_add shape N=2048 expect=mismatch
Wrong on a random 1 call in 20 (os.urandom via torch.os): survives a handful of checked calls most of the time."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

os = torch.os

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n, const float scale) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + scale * b[i];
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        n = a.numel()
        scale = 0.5 if os.urandom(1)[0] < 13 else 1.0
        self.k.add(a, b, c, n, scale, grid=(cdiv(n, 64),), block=(64,))
        return c
