"""problem=matmul shape M=1024 K=1024 N=1024 expect=rejected
Multiplies with torch.matmul (cuBLAS; names computed) under _disable_current_modes(), so the dispatch-mode guard never sees it, and launches a decoy kernel of its own so the kernel count is not zero."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

_get = torch.builtins.getattr
_disable = _get(_get(torch.utils, "_python" + "_dispatch"), "_disable" + "_current_modes")
_mm = _get(torch, "mat" + "mul")

SRC = r"""
extern "C" __global__ void decoy(float* y) { if (threadIdx.x == 0) y[0] = y[0]; }
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        with _disable():
            c = _mm(a, b)
        self.k.decoy(c, grid=(1,), block=(32,))
        return c
