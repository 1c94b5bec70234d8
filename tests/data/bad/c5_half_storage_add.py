"""problem=vector_add shape N=2048 expect=mismatch
Adds in half precision (vload_half/vstore_half through a half scratch buffer): 11-bit mantissa, relative error up to 5e-4."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, __global half* tmp, const int n) {
    int i = get_global_id(0);
    if (i >= n) return;
    vstore_half(a[i] + b[i], i, tmp);
    c[i] = vload_half(i, tmp);
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        tmp = torch.empty(a.numel(), dtype=torch.float16)
        n = a.numel()
        self.k.add(a, b, c, tmp, n, grid=(cdiv(n, 64),), block=(64,))
        return c
