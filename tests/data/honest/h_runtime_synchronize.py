"""problem=vector_add shape N=2048 expect=correct
Calls kfoundry.runtime.synchronize() after its launch (harmless, documented API)."""
import torch
import torch.nn as nn

import kfoundry.runtime
from kfoundry.runtime import cdiv, load

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
        c = torch.empty_like(a)
        n = a.numel()
        self.k.add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
        kfoundry.runtime.synchronize()
        return c
