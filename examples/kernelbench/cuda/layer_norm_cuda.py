"""Layer norm over very long rows: many blocks per row. Pass 1 writes per-block (sum, sum of squares)
in double; pass 2 has every block reduce its row's partials, then normalise its chunk (16-byte
accesses where the row length allows)."""

import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__device__ __forceinline__ double block_sum(double s, double* ws) {
    const int t = threadIdx.x;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((t & 31) == 0) ws[t >> 5] = s;
    __syncthreads();
    if (t < 32) {
        s = t < (int)(blockDim.x >> 5) ? ws[t] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (t == 0) ws[32] = s;
    }
    __syncthreads();
    s = ws[32];
    __syncthreads();
    return s;
}

// grid (chunks, rows); each block sums CHUNK elements of its row.
extern "C" __global__ void __launch_bounds__(BLOCK)
ln_partial(const float* __restrict__ x, double2* __restrict__ partials, long long cols) {
    __shared__ double ws[33];
    const float* xr = x + (size_t)blockIdx.y * cols;
    const long long begin = (long long)blockIdx.x * CHUNK;
    const long long end = min(begin + CHUNK, cols);
    float s = 0.0f, q = 0.0f;
#if VEC == 4
    const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll 4
    for (long long i = begin / 4 + threadIdx.x; i < end / 4; i += BLOCK) {
        const float4 v = x4[i];
        s += (v.x + v.y) + (v.z + v.w);
        q += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
    }
#else
#pragma unroll 4
    for (long long i = begin + threadIdx.x; i < end; i += BLOCK) {
        const float v = xr[i];
        s += v;
        q += v * v;
    }
#endif
    const double ds = block_sum((double)s, ws);
    const double dq = block_sum((double)q, ws);
    if (threadIdx.x == 0) partials[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = make_double2(ds, dq);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
ln_apply(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y,
         const double2* __restrict__ partials, long long cols, float eps) {
    __shared__ double ws[33];
    const double2* pr = partials + (size_t)blockIdx.y * gridDim.x;
    double s = 0.0, q = 0.0;
    for (int i = threadIdx.x; i < (int)gridDim.x; i += BLOCK) { s += pr[i].x; q += pr[i].y; }
    s = block_sum(s, ws);
    q = block_sum(q, ws);
    const double mean_d = s / (double)cols;
    const float mean = (float)mean_d;
    const float rstd = (float)(1.0 / sqrt(fmax(q / (double)cols - mean_d * mean_d, 0.0) + (double)eps));
    const float* xr = x + (size_t)blockIdx.y * cols;
    float* yr = y + (size_t)blockIdx.y * cols;
    const long long begin = (long long)blockIdx.x * CHUNK;
    const long long end = min(begin + CHUNK, cols);
#if VEC == 4
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* y4 = reinterpret_cast<float4*>(yr);
#pragma unroll 4
    for (long long i = begin / 4 + threadIdx.x; i < end / 4; i += BLOCK) {
        const float4 v = x4[i], g = w4[i], h = b4[i];
        y4[i] = make_float4((v.x - mean) * rstd * g.x + h.x, (v.y - mean) * rstd * g.y + h.y,
                            (v.z - mean) * rstd * g.z + h.z, (v.w - mean) * rstd * g.w + h.w);
    }
#else
#pragma unroll 4
    for (long long i = begin + threadIdx.x; i < end; i += BLOCK) yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
#endif
}
"""

BLOCK = 512
CHUNK = 16384


def _aligned(*tensors):
    """float4 loads and stores need 16-byte aligned addresses (an input may start anywhere)."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)
        self.programs = {}

    def forward(self, x):
        x = x.contiguous()
        rows = x.shape[0]
        cols = x.numel() // rows
        y = torch.empty_like(x)
        vec = 4 if cols % 4 == 0 and _aligned(x, y, self.ln.weight, self.ln.bias) else 1
        if vec not in self.programs:
            self.programs[vec] = load(SRC, defines={"BLOCK": BLOCK, "CHUNK": CHUNK, "VEC": vec})
        prog = self.programs[vec]
        chunks = cdiv(cols, CHUNK)
        partials = torch.empty(rows, chunks, 2, dtype=torch.float64, device=x.device)
        prog.ln_partial(x, partials, cols, grid=(chunks, rows), block=(BLOCK,))
        prog.ln_apply(
            x,
            self.ln.weight,
            self.ln.bias,
            y,
            partials,
            cols,
            self.ln.eps,
            grid=(chunks, rows),
            block=(BLOCK,),
        )
        return y
