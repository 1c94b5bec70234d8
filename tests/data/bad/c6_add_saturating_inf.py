"""problem=vector_add shape N=2048 expect=mismatch
A 'saturating' add that clamps to +-FLT_MAX and maps NaN to 0: identical on finite U[0,1) inputs, wrong where torch gives inf or NaN."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i >= n) return;
    float s = a[i] + b[i];
    c[i] = isnan(s) ? 0.0f : clamp(s, -FLT_MAX, FLT_MAX);
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
