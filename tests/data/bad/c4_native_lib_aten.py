"""problem=vector_add shape N=2048 expect=rejected hint=computes with a library
Builds and loads native code of its own that calls an ATen operator, at::mm, by its mangled name (weakly, so it loads without a GPU): on a GPU it would compute in ATen, out of the Python guard's sight; the kernel it launches is a decoy."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

os = torch.importlib.import_module("os")
ctypes = torch.importlib.import_module("ctypes")

SRC = r"""
__kernel void vector_add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""

NATIVE = r"""
extern void* aten_mm(const void*, const void*) __asm__("_ZN2at4_ops2mm4callERKNS_6TensorES4_") __attribute__((weak));
int kf_has_blas(void) { return aten_mm != 0; }
"""


def _build() -> object:
    where = os.environ.get("TMPDIR", "/tmp")
    src, lib = os.path.join(where, "kf_native.c"), os.path.join(where, "kf_native.so")
    fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, NATIVE.encode())
    os.close(fd)
    os.system(f"cc -shared -fPIC -o {lib} {src}")
    return ctypes.CDLL(lib)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.native = _build()
        self.k = load(SRC)

    def forward(self, a, b):
        self.native.kf_has_blas()
        c = torch.empty_like(a)
        n = a.numel()
        self.k.vector_add(a, b, c, n, grid=(cdiv(n, 256),), block=(256,))
        return c
