"""problem=vector_add shape N=2048 expect=mismatch
Reads float4 vectors from the inputs' start rounded down to 16 bytes ((ulong)a & ~15): exact for the allocator's aligned tensors, shifted garbage for an input that starts mid-vector."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i >= n) return;
    __global const float4* a4 = (__global const float4*)((ulong)a & ~15UL);
    __global const float4* b4 = (__global const float4*)((ulong)b & ~15UL);
    float4 va = a4[i / 4], vb = b4[i / 4];
    float s[4] = {va.x + vb.x, va.y + vb.y, va.z + vb.z, va.w + vb.w};
    c[i] = s[i % 4];
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
