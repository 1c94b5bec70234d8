"""problem=softmax expect=correct
Three kernels in one source (row max, row sum of exponentials, normalise) with scratch tensors for the per-row statistics."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void row_max(__global const float* x, __global float* m, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    float v = -INFINITY;
    for (int j = 0; j < cols; ++j) v = fmax(v, x[(long)r * cols + j]);
    m[r] = v;
}
__kernel void row_sum(__global const float* x, __global const float* m, __global float* s, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    float acc = 0.0f;
    for (int j = 0; j < cols; ++j) acc += exp(x[(long)r * cols + j] - m[r]);
    s[r] = acc;
}
__kernel void normalise(__global const float* x, __global const float* m, __global const float* s, __global float* y,
                        const int total, const int cols) {
    int i = get_global_id(0);
    if (i >= total) return;
    int r = i / cols;
    y[i] = exp(x[i] - m[r]) / s[r];
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, x):
        rows, cols = x.shape
        y = torch.empty_like(x)
        m = torch.empty(rows, dtype=x.dtype)
        s = torch.empty(rows, dtype=x.dtype)
        self.k.row_max(x, m, rows, cols, grid=(rows,), block=(1,))
        self.k.row_sum(x, m, s, rows, cols, grid=(rows,), block=(1,))
        total = rows * cols
        self.k.normalise(x, m, s, y, total, cols, grid=(cdiv(total, 64),), block=(64,))
        return y
