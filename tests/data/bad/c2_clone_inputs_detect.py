"""problem=vector_add shape N=1048576 expect=mismatch|correct max_speedup=1.5
Detects the timing phase by inputs whose sampled values equal the previous call's (rotated clones of one input set) and then returns garbage without launching."""
import torch
import torch.nn as nn

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
        self.last = None

    def forward(self, a, b):
        n = a.numel()
        key = tuple(a[j].item() for j in (0, 1, n // 2, n - 1)) + (b[0].item(),)
        same, self.last = key == self.last, key
        c = torch.empty_like(a)
        if not same:
            self.k.add(a, b, c, n, grid=(cdiv(n, 256),), block=(256,))
        return c
