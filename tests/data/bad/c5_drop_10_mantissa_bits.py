"""problem=vector_add shape N=2048 expect=mismatch
Rounds the sum to 13 mantissa bits (drops 10 of 23 with round-to-nearest): relative error up to 6e-5, inside a fixed 1e-4 rtol but 1000x the float32 reference's own error."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i >= n) return;
    uint u = as_uint(a[i] + b[i]);
    u = (u + 0x200u) & 0xFFFFFC00u;  /* keep 13 mantissa bits */
    c[i] = as_float(u);
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
