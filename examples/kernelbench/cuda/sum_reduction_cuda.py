"""Sum over one dimension (keepdim): x viewed as (outer, R, inner). Inner > 1: each thread sums one
column over a segment of R (coalesced across the warp, 8 loads in flight) and adds it atomically;
inner == 1: one warp-shuffle block reduction per row."""

import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
extern "C" __global__ void __launch_bounds__(256)
sum_columns(const float* __restrict__ x, float* __restrict__ out, int reduce, int inner, int seg) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= inner) return;
    const int r0 = blockIdx.y * seg;
    const int r1 = min(r0 + seg, reduce);
    const float* p = x + ((size_t)blockIdx.z * reduce + r0) * inner + col;
    float acc = 0.0f;
#pragma unroll 8
    for (int r = r0; r < r1; ++r, p += inner) acc += *p;
    atomicAdd(out + (size_t)blockIdx.z * inner + col, acc);
}

extern "C" __global__ void __launch_bounds__(256)
sum_rows(const float* __restrict__ x, float* __restrict__ out, int reduce) {
    __shared__ float ws[8];
    const float* p = x + (size_t)blockIdx.x * reduce;
    float acc = 0.0f;
    for (int r = threadIdx.x; r < reduce; r += 256) acc += p[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < 8; ++w) s += ws[w];
        out[blockIdx.x] = s;
    }
}
"""


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.k = load(SRC)

    def forward(self, x):
        x = x.contiguous()
        shape = list(x.shape)
        dim = self.dim % len(shape)
        reduce = shape[dim]
        outer = 1
        for s in shape[:dim]:
            outer *= s
        inner = x.numel() // (outer * reduce)
        out_shape = shape[:dim] + [1] + shape[dim + 1 :]
        if inner == 1:
            out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
            self.k.sum_rows(x, out, reduce, grid=(outer,), block=(256,))
            return out
        out = torch.zeros(out_shape, dtype=x.dtype, device=x.device)
        col_blocks = cdiv(inner, 256)
        segments = max(1, min(cdiv(reduce, 32), cdiv(8192, col_blocks * outer), 65535))
        seg = cdiv(reduce, segments)
        self.k.sum_columns(
            x, out, reduce, inner, seg, grid=(col_blocks, cdiv(reduce, seg), outer), block=(256,)
        )
        return out
