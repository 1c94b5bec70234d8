"""problem=vector_add shape N=1048576 expect=mismatch|rejected|correct max_speedup=1.5
Asks torch for the current dispatch mode (_get_current_dispatch_mode via computed names) and grad mode: a poisoning guard means checked; otherwise (timed) no work."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""

_get = torch.builtins.getattr
_grad_enabled = torch.is_grad_enabled
_current = _get(_get(torch.utils, "_python" + "_dispatch"), "_get_current" + "_dispatch_mode")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        mode = _current()
        checked = mode is not None and _get(mode, "poison_fresh", True)
        c = torch.empty_like(a)
        if checked or _grad_enabled():
            n = a.numel()
            self.k.add(a, b, c, n, grid=(cdiv(n, 256),), block=(256,))
        return c
