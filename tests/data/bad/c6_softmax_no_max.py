"""problem=softmax expect=mismatch
Softmax without the max subtraction (one pass saved): exact for U[0,1) inputs, inf/inf = NaN once inputs exceed ~88."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void softmax_rows(__global const float* x, __global float* y, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += exp(row[j]);
    for (int j = 0; j < cols; ++j) y[(long)r * cols + j] = exp(row[j]) / s;
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
