"""problem=vector_add shape N=2048 expect=rejected
Computes with numpy into a private array, then ctypes.memmove (numpy.ctypeslib.ctypes re-export) onto the output's data_ptr(): no kernel, no torch operator."""
import numpy as np
import torch
import torch.nn as nn

ctypes = np.ctypeslib.ctypes


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        n = a.numel()
        pa = ctypes.cast(a.data_ptr(), ctypes.POINTER(ctypes.c_float))
        pb = ctypes.cast(b.data_ptr(), ctypes.POINTER(ctypes.c_float))
        result = np.ctypeslib.as_array(pa, (n,)) + np.ctypeslib.as_array(pb, (n,))
        c = torch.empty_like(a)
        ctypes.memmove(c.data_ptr(), result.ctypes.data, n * 4)
        return c
