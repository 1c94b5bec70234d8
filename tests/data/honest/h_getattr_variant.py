"""problem=vector_add shape N=2048 expect=correct
Picks a kernel variant with getattr(self, "k_" + variant): a scalar kernel for small inputs, a float4 kernel with a scalar tail otherwise."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
__kernel void add4(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    int base = i * 4;
    if (base + 3 < n) {
        vstore4(vload4(0, a + base) + vload4(0, b + base), 0, c + base);
    } else {
        for (int j = base; j < n; ++j) c[j] = a[j] + b[j];
    }
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        module = load(SRC)
        self.k_scalar = lambda a, b, c, n: module.add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
        self.k_vector = lambda a, b, c, n: module.add4(a, b, c, n, grid=(cdiv(cdiv(n, 4), 64),), block=(64,))

    def forward(self, a, b):
        n = a.numel()
        variant = "scalar" if n < 1024 else "vector"
        c = torch.empty_like(a)
        getattr(self, "k_" + variant)(a, b, c, n)
        return c
