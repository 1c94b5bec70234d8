"""problem=matmul shape M=1024 K=1024 N=1024 expect=rejected
Multiplies with CuPy (cuBLAS) on zero-copy views of the tensors (__cuda_array_interface__), CuPy imported under a computed name; no torch operator runs and a decoy kernel launches."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

cp = torch.importlib.import_module("cu" + "py")

SRC = r"""
extern "C" __global__ void decoy(float* y) { if (threadIdx.x == 0) y[0] = y[0]; }
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        cp.matmul(cp.asarray(a), cp.asarray(b), out=cp.asarray(c))
        self.k.decoy(c, grid=(1,), block=(32,))
        return c
