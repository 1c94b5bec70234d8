"""problem=matmul shape M=1024 K=1024 N=1024 expect=rejected hint=computes with a library
A load_inline extension that calls torch::matmul (ATen, cuBLAS) from C++ and switches TF32 on for the whole process; a decoy kernel of its own is launched so a kernel count is not zero."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

from kfoundry.runtime import load

CPP_SRC = r"""
#include <torch/extension.h>
torch::Tensor mm(torch::Tensor a, torch::Tensor b) {
    at::globalContext().setAllowTF32CuBLAS(true);
    return torch::matmul(a, b);
}
"""

SRC = r"""
extern "C" __global__ void decoy(float* y) { if (threadIdx.x == 0) y[0] = y[0]; }
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="kf_cheat_mm", cpp_sources=CPP_SRC, functions=["mm"], verbose=False)
        self.k = load(SRC)

    def forward(self, a, b):
        c = self.ext.mm(a, b)
        self.k.decoy(c, grid=(1,), block=(32,))
        return c
