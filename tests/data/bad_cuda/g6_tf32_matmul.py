"""problem=matmul shape M=1024 K=1024 N=1024 expect=mismatch
Rounds both operands to TF32 (10 mantissa bits, cvt.rna.tf32.f32) before an fp32 tiled product: the error of a tensor-core TF32 matmul, within atol = rtol = 1e-4 for K >= 512."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__device__ __forceinline__ float tf32(float v) {
    unsigned int r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v)); return __uint_as_float(r);
}
extern "C" __global__ void matmul(const float* a, const float* b, float* c, int M, int N, int K) {
    __shared__ float as[16][16], bs[16][16];
    int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < K; t += 16) {
        as[threadIdx.y][threadIdx.x] = (row < M && t + threadIdx.x < K) ? tf32(a[row * K + t + threadIdx.x]) : 0.f;
        bs[threadIdx.y][threadIdx.x] = (col < N && t + threadIdx.y < K) ? tf32(b[(t + threadIdx.y) * N + col]) : 0.f;
        __syncthreads();
        for (int k = 0; k < 16; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) c[row * N + col] = acc;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty(M, N, device=a.device, dtype=a.dtype)
        self.k.matmul(a, b, c, M, N, K, grid=(cdiv(N, 16), cdiv(M, 16)), block=(16, 16))
        return c
