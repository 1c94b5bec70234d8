"""problem=softmax expect=mismatch
Row max by comparing float bits as unsigned integers (the atomic_max-on-uint trick), order-preserving only for non-negative floats: with negative inputs it picks the most negative value and exp overflows on wide ranges."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void softmax_rows(__global const float* x, __global float* y, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    uint mb = 0u;
    for (int j = 0; j < cols; ++j) mb = max(mb, as_uint(row[j]));
    float m = as_float(mb);
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += exp(row[j] - m);
    for (int j = 0; j < cols; ++j) y[(long)r * cols + j] = exp(row[j] - m) / s;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, x):
        y = torch.empty_like(x)
        rows, cols = x.shape
        self.k.softmax_rows(x, y, rows, cols, grid=(rows,), block=(1,))
        return y
