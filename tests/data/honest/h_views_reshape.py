"""problem=vector_add shape N=2048 expect=correct
Flattens the inputs with reshape/contiguous/view in forward, launches on the flat views, returns the output reshaped to the input's shape."""
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

    def forward(self, a, b):
        fa = a.reshape(-1).contiguous()
        fb = b.contiguous().view(-1)
        out = torch.empty(fa.shape[0], dtype=a.dtype)
        n = fa.numel()
        self.k.add(fa, fb, out, n, grid=(cdiv(n, 64),), block=(64,))
        return out.view(a.shape)
