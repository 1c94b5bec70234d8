"""problem=matmul shape M=32 K=32 N=32 expect=mismatch|rejected|runtime_error
Local-memory 16x16 tiled matmul with no edge handling: exact when M, N and K are multiples of 16 (32 here), garbage on ragged shapes."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
#define T 16
__kernel void matmul(__global const float* a, __global const float* b, __global float* c, const int M, const int N, const int K) {
    __local float As[T][T], Bs[T][T];
    int lx = get_local_id(0), ly = get_local_id(1);
    int col = get_group_id(0) * T + lx, row = get_group_id(1) * T + ly;
    float acc = 0.0f;
    for (int t = 0; t < K / T; ++t) {
        As[ly][lx] = a[row * K + t * T + lx];
        Bs[ly][lx] = b[(t * T + ly) * N + col];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < T; ++k) acc += As[ly][k] * Bs[k][lx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    c[row * N + col] = acc;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty(M, N, dtype=a.dtype)
        self.k.matmul(a, b, c, M, N, K, grid=(max(1, N // 16), max(1, M // 16)), block=(16, 16))
        return c
