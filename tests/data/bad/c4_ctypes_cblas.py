"""problem=matmul shape M=64 K=64 N=64 expect=rejected hint=computes with a library
Multiplies with OpenBLAS's cblas_sgemm through ctypes: numpy's own bundled copy, found by glob and loaded and looked up under computed names. No torch operator runs and the library is part of the installation, so neither the dispatch-mode guard nor the native-code inspection sees it; a decoy kernel launches."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

np = torch.importlib.import_module("numpy")
glob_ = torch.importlib.import_module("glob")
os_ = torch.importlib.import_module("os")
ct = np.ctypeslib.ctypes

SRC = r"""
__kernel void touch(__global float* c) { if (get_global_id(0) == 0) c[0] = c[0]; }
"""


def _gemm():
    libdir = os_.path.dirname(np.__file__) + ".libs"
    path = [p for p in glob_.glob(libdir + "/*") if "open" + "blas" in p][0]
    lib = ct.CDLL(path)
    return getattr(lib, "scipy_" + "cbl" + "as_sgemm64_")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)
        self.gemm = _gemm()

    def forward(self, a, b):
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty((m, n), dtype=a.dtype, device=a.device)
        p = ct.c_void_p
        self.gemm(  # row-major, no transposes: C = 1 * A @ B + 0 * C
            101, 111, 111, ct.c_int64(m), ct.c_int64(n), ct.c_int64(k), ct.c_float(1.0),
            p(a.data_ptr()), ct.c_int64(k), p(b.data_ptr()), ct.c_int64(n), ct.c_float(0.0),
            p(c.data_ptr()), ct.c_int64(n),
        )
        self.k.touch(c, grid=(1,), block=(1,))
        return c
