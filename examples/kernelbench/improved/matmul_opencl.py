# ruff: noqa: F821  (PARAMS, the template parameter values, is injected by the harness)
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

# Improved for CPU OpenCL (PoCL): each work-item computes an RB x VW block of C with VW-wide vectors:
# rows of B are streamed contiguously (vloadVW), each A value is broadcast once per row of the block,
# and the RB x VW accumulators stay in registers (register blocking). Edges fall back to scalar code.
# Tunables: RB in {1, 2, 4, 8}, VW in {4, 8}.
SRC = r"""
#ifndef RB
#define RB 8
#endif
#ifndef VW
#define VW 8
#endif
#define CAT(a, b) a##b
#define XCAT(a, b) CAT(a, b)
#define floatV XCAT(float, VW)
#define vloadV XCAT(vload, VW)
#define vstoreV XCAT(vstore, VW)
__kernel void matmul_vec(__global const float* a, __global const float* b, __global float* c,
                         const int M, const int N, const int K) {
    const int col = get_global_id(0) * VW;
    const int row = get_global_id(1) * RB;
    if (col >= N || row >= M) return;
    if (col + VW <= N && row + RB <= M) {
        floatV acc[RB];
        for (int r = 0; r < RB; ++r) acc[r] = (floatV)(0.0f);
        for (int k = 0; k < K; ++k) {
            const floatV bv = vloadV(0, b + (long)k * N + col);
            for (int r = 0; r < RB; ++r) acc[r] = fma((floatV)(a[(long)(row + r) * K + k]), bv, acc[r]);
        }
        for (int r = 0; r < RB; ++r) vstoreV(acc[r], 0, c + (long)(row + r) * N + col);
        return;
    }
    for (int r = row; r < min(row + RB, M); ++r)
        for (int j = col; j < min(col + VW, N); ++j) {
            float acc = 0.0f;
            for (int k = 0; k < K; ++k) acc = fma(a[(long)r * K + k], b[(long)k * N + j], acc);
            c[(long)r * N + j] = acc;
        }
}
"""

RB = PARAMS.get("RB", 8)
VW = PARAMS.get("VW", 8)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC, defines={**PARAMS, "RB": RB, "VW": VW})

    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty(M, N, dtype=a.dtype)
        self.k.matmul_vec(a, b, c, M, N, K, grid=(cdiv(N, VW), cdiv(M, RB)))
        return c
