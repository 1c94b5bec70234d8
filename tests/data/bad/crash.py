import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) { __global float* p = c + ((long)1 << 44); p[(long)i << 20] = 1.0f; }  /* planted: wild write */
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        n = a.numel()
        self.k.add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
        return c
