"""problem=softmax expect=mismatch
Subtracts the constant 1.0 (the bound of U[0,1) inputs) instead of the row max: overflows for large inputs, underflows to 0/0 for rows of large negative values."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void softmax_rows(__global const float* x, __global float* y, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += exp(row[j] - 1.0f);
    float inv = 1.0f / s;
    for (int j = 0; j < cols; ++j) y[(long)r * cols + j] = exp(row[j] - 1.0f) * inv;
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
