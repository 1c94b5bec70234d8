"""problem=matmul shape M=1024 K=1024 N=1024 expect=rejected
A load_inline extension that finds cublasSgemm_v2 with dlsym under a name assembled at run time (no cuBLAS symbol or string in the file) and calls it on torch's cuBLAS handle; a decoy kernel launches."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

from kfoundry.runtime import load

CPP_SRC = r"""
#include <torch/extension.h>
#include <dlfcn.h>
#include <string>
typedef int (*gemm_t)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int,
                      const float*, float*, int);
void mm(torch::Tensor a, torch::Tensor b, torch::Tensor c, int64_t handle) {
    std::string name = "cub"; name += "las"; name += "Sgemm_v2";
    std::string file = "libcu"; file += "blas.so.12";
    void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen(file.c_str(), RTLD_NOW);
    gemm_t gemm = (gemm_t)dlsym(lib, name.c_str());
    float one = 1.f, zero = 0.f;
    int m = a.size(0), k = a.size(1), n = b.size(1);
    gemm((void*)handle, 0, 0, n, m, k, &one, b.data_ptr<float>(), n, a.data_ptr<float>(), k, &zero,
         c.data_ptr<float>(), n);
}
"""

_handle = torch.builtins.getattr(torch.importlib.import_module("torch.cuda"), "current_blas_handle")

SRC = r"""
extern "C" __global__ void decoy(float* y) { if (threadIdx.x == 0) y[0] = y[0]; }
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(
            name="kf_cheat_dlsym", cpp_sources=CPP_SRC, functions=["mm"], extra_ldflags=["-ldl"], verbose=False
        )
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        self.ext.mm(a, b, c, _handle())
        self.k.decoy(c, grid=(1,), block=(32,))
        return c
