"""problem=matmul shape M=1024 K=1024 N=1024 expect=rejected
Calls cublasSgemm_v2 through ctypes on torch's own cuBLAS handle: the library file is found in the process's memory map and loaded, and the symbol looked up, under computed names; no torch operator runs and a decoy kernel launches."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

np = torch.importlib.import_module("numpy")
ct = np.ctypeslib.ctypes
_open = torch.builtins.getattr(torch.builtins, "op" + "en")

_handle = torch.builtins.getattr(torch.importlib.import_module("torch.cuda"), "current_blas_handle")

SRC = r"""
extern "C" __global__ void decoy(float* y) { if (threadIdx.x == 0) y[0] = y[0]; }
"""


def _sgemm():
    with _open("/proc/self/maps") as handle:
        paths = [line.split()[-1] for line in handle if "cu" + "blas.so" in line or "cu" + "blas-" in line]
    lib = ct.CDLL(sorted(p for p in paths if "Lt" not in p)[0])
    return getattr(lib, "cub" + "lasSgemm_v2")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)
        self.gemm = _sgemm()

    def forward(self, a, b):
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty((m, n), dtype=a.dtype, device=a.device)
        one, zero = ct.c_float(1.0), ct.c_float(0.0)
        handle = ct.c_void_p(_handle())
        p = ct.c_void_p
        # column-major cuBLAS: C^T = B^T A^T, i.e. gemm(n, m, k) on (b, a)
        self.gemm(handle, 0, 0, n, m, k, ct.byref(one), p(b.data_ptr()), n, p(a.data_ptr()), k,
                  ct.byref(zero), p(c.data_ptr()), n)
        self.k.decoy(c, grid=(1,), block=(32,))
        return c
