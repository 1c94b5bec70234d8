"""problem=matmul expect=mismatch
bf16 matmul: truncates both operands to 7 mantissa bits before multiplying (the classic dropped-mantissa speed trick)."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
inline float bf16(float x) { return as_float((as_uint(x) + 0x8000u) & 0xFFFF0000u); }
__kernel void matmul(__global const float* a, __global const float* b, __global float* c,
                     const int M, const int N, const int K) {
    int col = get_global_id(0), row = get_global_id(1);
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += bf16(a[row * K + k]) * bf16(b[k * N + col]);
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
        self.k.matmul(a, b, c, M, N, K, grid=(cdiv(N, 8), cdiv(M, 8)), block=(8, 8))
        return c
