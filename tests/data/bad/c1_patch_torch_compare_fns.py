"""problem=vector_add shape N=2048 expect=mismatch
Replaces torch.allclose / torch.isclose / torch.equal / torch.isnan / torch.isfinite in the torch module itself (object.__setattr__), hoping the checker looks them up at call time; the kernel is 2% off."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = (a[i] + b[i]) * 1.02f;
}
"""

_ones, _zeros = torch.ones_like, torch.zeros_like
for _name, _fake in (
    ("allclose", lambda *a, **k: True),
    ("equal", lambda *a, **k: True),
    ("isclose", lambda o, *a, **k: _ones(o, dtype=torch.bool)),
    ("isnan", lambda o, *a, **k: _zeros(o, dtype=torch.bool)),
    ("isfinite", lambda o, *a, **k: _ones(o, dtype=torch.bool)),
):
    object.__setattr__(torch, _name, _fake)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        n = a.numel()
        self.k.add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
        return c
