"""problem=vector_add shape N=2048 expect=mismatch
Flushes sums below 1e-20 in magnitude to zero (a 'denormal guard'): invisible to a fixed atol, 100% relative error on tiny inputs."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i >= n) return;
    float s = a[i] + b[i];
    c[i] = fabs(s) < 1e-20f ? 0.0f : s;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC, build_options=["-cl-denorms-are-zero"])

    def forward(self, a, b):
        c = torch.empty_like(a)
        n = a.numel()
        self.k.add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
        return c
