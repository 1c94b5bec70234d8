"""problem=vector_add shape N=2048 expect=mismatch
Wrong only for elements in the rare range [0.5, 0.5 + 2.5e-5) (about one call in twenty at N=2048 U[0,1) inputs touches it)."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i >= n) return;
    float x = a[i];
    c[i] = (x >= 0.5f && x < 0.500025f) ? x : x + b[i];
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
