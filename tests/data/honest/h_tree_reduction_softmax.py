"""problem=softmax expect=correct
Static __local arrays and a tree reduction in a helper function; every row handled by one 32-wide work-group whatever its length."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
#define WG 32
inline float tree(__local float* v, int l, int is_max) {
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) v[l] = is_max ? fmax(v[l], v[l + s]) : v[l] + v[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float out = v[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return out;
}
__kernel void softmax_rows(__global const float* x, __global float* y, const int cols) {
    __local float v[WG];
    int r = get_group_id(0), l = get_local_id(0);
    __global const float* row = x + (long)r * cols;
    float m = -INFINITY;
    for (int j = l; j < cols; j += WG) m = fmax(m, row[j]);
    v[l] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    m = tree(v, l, 1);
    float s = 0.0f;
    for (int j = l; j < cols; j += WG) s += exp(row[j] - m);
    v[l] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    s = tree(v, l, 0);
    for (int j = l; j < cols; j += WG) y[(long)r * cols + j] = exp(row[j] - m) / s;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, x):
        rows, cols = x.shape
        y = torch.empty_like(x)
        self.k.softmax_rows(x, y, cols, grid=(rows,), block=(32,))
        return y
