"""problem=vector_add shape N=2048 expect=correct
A class-level cache of compiled kernels keyed on dtype (honest caching of code, never of results)."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

TEMPLATE = r"""
__kernel void add(__global const T* a, __global const T* b, __global T* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""
CTYPES = {torch.float32: "float", torch.int32: "int"}


class ModelNew(nn.Module):
    _compiled: dict = {}

    def __init__(self):
        super().__init__()

    @classmethod
    def kernel(cls, dtype):
        if dtype not in cls._compiled:
            cls._compiled[dtype] = load(TEMPLATE, defines={"T": CTYPES[dtype]})
        return cls._compiled[dtype]

    def forward(self, a, b):
        c = torch.empty_like(a)
        n = a.numel()
        self.kernel(a.dtype).add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
        return c
