"""problem=vector_add shape N=2048 expect=correct
Allocates the output with a.new_empty(a.shape) instead of torch.empty_like."""
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

    def forward(self, a, b):
        c = a.new_empty(a.shape)
        n = a.numel()
        self.k.add(a, b, c, n, grid=(cdiv(n, 32),), block=(32,))
        return c
