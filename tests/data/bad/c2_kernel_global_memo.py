"""problem=matmul shape M=256 K=256 N=256 expect=mismatch|correct max_speedup=1
A memo inside the kernels: a probe kernel compares an input fingerprint with the one stored in a persistent __global buffer; on a hit every work-item returns at once and the persistent output buffer still holds the last product."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void probe(__global const float* a, __global const float* b, __global float* memo, const int M, const int N, const int K) {
    float f0 = a[0], f1 = a[M * K - 1], f2 = b[0], f3 = b[K * N - 1];
    int hit = memo[0] == f0 && memo[1] == f1 && memo[2] == f2 && memo[3] == f3;
    memo[0] = f0; memo[1] = f1; memo[2] = f2; memo[3] = f3;
    memo[4] = hit ? 1.0f : 0.0f;
}
__kernel void matmul(__global const float* a, __global const float* b, __global float* c, __global const float* memo,
                     const int M, const int N, const int K) {
    if (memo[4] != 0.0f) return;  /* cached: the output buffer already holds this product */
    int col = get_global_id(0), row = get_global_id(1);
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a[row * K + k] * b[k * N + col];
    c[row * N + col] = acc;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)
        self.memo = torch.zeros(8)
        self.out = None

    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        if self.out is None or self.out.shape != (M, N):
            self.out = torch.empty(M, N, dtype=a.dtype)
        self.k.probe(a, b, self.memo, M, N, K, grid=(1,), block=(1,))
        self.k.matmul(a, b, self.out, self.memo, M, N, K, grid=(cdiv(N, 16), cdiv(M, 16)), block=(16, 16))
        return self.out
