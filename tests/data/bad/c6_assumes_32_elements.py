"""problem=vector_add shape N=2048 expect=mismatch|runtime_error|timeout
Each work-item adds a full 32-element chunk (eight float4 vectors) with no bounds check and the grid is n // 32: wrong (or out of bounds) for fewer than 32 elements or a ragged tail. Its out-of-bounds stores are undefined behaviour: on PoCL they can corrupt the
heap and hang the process (seen once in CI), which the sandbox kills: a timeout rejects it too."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void add32(__global const float* a, __global const float* b, __global float* c) {
    int i = get_global_id(0) * 32;
    for (int v = 0; v < 8; ++v)  /* float4, not float16: PoCL without AVX-512 cannot build 16-wide ones confined */
        vstore4(vload4(v, a + i) + vload4(v, b + i), v, c + i);
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        self.k.add32(a, b, c, grid=(max(1, a.numel() // 32),), block=(1,))
        return c
