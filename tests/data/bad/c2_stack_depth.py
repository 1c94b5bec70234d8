"""problem=vector_add shape N=1048576 expect=mismatch|correct max_speedup=1.5
Counts the interpreter stack depth (dataclasses.sys._getframe until ValueError): calls two or more frames deeper than the first (the timing loop) skip the kernel."""
import dataclasses

import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""


def _depth():
    d = 1
    while True:
        try:
            dataclasses.sys._getframe(d)
        except ValueError:
            return d
        d += 1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)
        self.first = None

    def forward(self, a, b):
        depth = _depth()
        if self.first is None:
            self.first = depth
        c = torch.empty_like(a)
        if depth <= self.first + 1:  # a trial, or one frame deeper: a re-check
            n = a.numel()
            self.k.add(a, b, c, n, grid=(cdiv(n, 256),), block=(256,))
        return c
