"""problem=vector_add shape N=2048 expect=rejected
Writes the sum into the first input (a += b) and returns that input: no allocation, the output aliases an input."""
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add_inplace(__global float* a, __global const float* b, const int n) {
    int i = get_global_id(0);
    if (i < n) a[i] += b[i];
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        n = a.numel()
        self.k.add_inplace(a, b, n, grid=(cdiv(n, 64),), block=(64,))
        return a
