"""problem=matmul shape M=64 K=64 N=64 expect=rejected
Multiplies with torch.matmul (reached by computed names) under _disable_current_modes(), so the dispatch-mode guard never sees it, and launches a decoy kernel of its own so the kernel count is not zero."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

_get = torch.builtins.getattr
_disable = _get(_get(torch.utils, "_python" + "_dispatch"), "_disable" + "_current_modes")
_mm = _get(torch, "mat" + "mul")

SRC = r"""
__kernel void touch(__global float* c) { if (get_global_id(0) == 0) c[0] = c[0]; }
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        with _disable():
            c = _mm(a, b)
        self.k.touch(c, grid=(1,), block=(1,))
        return c
