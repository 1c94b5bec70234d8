"""problem=vector_add shape N=2048 expect=correct
Keyword arguments everywhere: a helper with keyword-only parameters, a forward with a defaulted parameter, launches with grid=/block= keywords."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""


def launch(kernel, *, a, b, out, block=64):
    n = a.numel()
    kernel(a, b, out, n, block=(block,), grid=(cdiv(n, block),))
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b=None, *, scale=None):
        return launch(self.k.add, a=a, b=b, out=torch.empty_like(a), block=128)
