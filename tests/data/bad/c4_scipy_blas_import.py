"""problem=matmul shape M=64 K=64 N=64 expect=rejected hint=computes with a library
Multiplies with SciPy's BLAS wrapper (scipy.linalg.blas.sgemm), imported at module level under a computed name through torch.importlib: the product never passes the torch dispatcher; a decoy kernel launches."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

blas = torch.importlib.import_module("sci" + "py.linalg.blas")

SRC = r"""
__kernel void touch(__global float* c) { if (get_global_id(0) == 0) c[0] = c[0]; }
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        product = blas.sgemm(1.0, a.numpy(), b.numpy())
        c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        c.numpy()[...] = product
        self.k.touch(c, grid=(1,), block=(1,))
        return c
