# ruff: noqa: F821  (PARAMS, the template parameter values, is injected by the harness)
import torch
import torch.nn as nn

from kfoundry.runtime import load

# Improved for CPU OpenCL (PoCL): one work-item per row, explicitly vectorised with float8 (8 SIMD
# lanes), two passes instead of three, each exponential computed once (stored, then scaled).
SRC = r"""
__kernel void softmax_vec8(__global const float* x, __global float* y, const int rows, const int cols) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    __global float* out = y + (long)r * cols;
    const int body = cols & ~7;
    float8 mv = (float8)(-INFINITY);
    for (int j = 0; j < body; j += 8) mv = fmax(mv, vload8(0, row + j));
    float4 m4 = fmax(mv.lo, mv.hi);
    float m = fmax(fmax(m4.x, m4.y), fmax(m4.z, m4.w));
    for (int j = body; j < cols; ++j) m = fmax(m, row[j]);
    float8 sv = (float8)(0.0f);
    for (int j = 0; j < body; j += 8) {
        float8 e = exp(vload8(0, row + j) - m);
        vstore8(e, 0, out + j);
        sv += e;
    }
    float4 s4 = sv.lo + sv.hi;
    float s = (s4.x + s4.y) + (s4.z + s4.w);
    for (int j = body; j < cols; ++j) { float e = exp(row[j] - m); out[j] = e; s += e; }
    const float inv = 1.0f / s;
    for (int j = 0; j < body; j += 8) vstore8(vload8(0, out + j) * inv, 0, out + j);
    for (int j = body; j < cols; ++j) out[j] *= inv;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC, defines=PARAMS)

    def forward(self, x):
        y = torch.empty_like(x)
        rows, cols = x.shape
        self.k.softmax_vec8(x, y, rows, cols, grid=(rows,), block=(1,))
        return y
