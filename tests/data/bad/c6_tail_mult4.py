"""problem=vector_add shape N=2048 expect=mismatch|runtime_error
float4 vector add over n/4 work-items: the last n % 4 elements are never written (correct whenever N is a multiple of 4, as 2048 is)."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add4(__global const float4* a, __global const float4* b, __global float4* c, const int n4) {
    int i = get_global_id(0);
    if (i < n4) c[i] = a[i] + b[i];
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        n4 = a.numel() // 4
        self.k.add4(a, b, c, n4, grid=(cdiv(n4, 64),), block=(64,))
        return c
