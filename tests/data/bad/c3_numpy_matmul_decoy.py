"""problem=matmul shape M=64 K=64 N=64 expect=rejected
Multiplies with numpy (np.matmul under a computed name) on .numpy() views of the tensors, writing into a fresh output; no torch operator runs and a decoy kernel launches."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

np = torch.importlib.import_module("numpy")
mm = getattr(np, "mat" + "mul")

SRC = r"""
__kernel void touch(__global float* c) { if (get_global_id(0) == 0) c[0] = c[0]; }
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        c.numpy()[...] = mm(a.numpy(), b.numpy())
        self.k.touch(c, grid=(1,), block=(1,))
        return c
