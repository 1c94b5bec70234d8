"""problem=vector_add shape N=2048 expect=mismatch|runtime_error|timeout
Grid rounded down to whole 256-wide work-groups and no bounds check: a tail that is not a multiple of 256 is dropped (N=2048 hides it)."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c) {
    int i = get_global_id(0);
    c[i] = a[i] + b[i];
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        groups = max(1, a.numel() // 256)
        self.k.add(a, b, c, grid=(groups,), block=(256,))
        return c
