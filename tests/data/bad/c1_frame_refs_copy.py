"""problem=vector_add shape N=2048 expect=mismatch|rejected
Walks caller frames (sys._getframe via the dataclasses.sys re-export, no f_back) to copy the judge's reference output; skips the work when timed."""
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


def _caller_locals():
    depth = 2
    while True:
        try:
            frame = dataclasses.sys._getframe(depth)
        except ValueError:
            return
        yield frame.f_code.co_name, frame.f_locals
        depth += 1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        for name, loc in _caller_locals():
            refs = loc.get("refs")
            if isinstance(refs, list) and refs and isinstance(refs[0], torch.Tensor) and refs[0].shape == a.shape:
                c.copy_(refs[0])  # the checker's own answer
                return c
            if "seed" in loc and "trial" in loc:  # a correctness trial whose reference runs later
                n = a.numel()
                self.k.add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
                return c
        return c  # timed: no work at all
