"""problem=softmax expect=mismatch
Treats NaN inputs as -inf (a 'robust' max via a > b ? a : b and a NaN-skipping sum): finite outputs where torch's softmax gives a NaN row."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void softmax_rows(__global const float* x, __global float* y, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    float m = -INFINITY;
    for (int j = 0; j < cols; ++j) m = row[j] > m ? row[j] : m;
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) { float e = exp(row[j] - m); s += (e == e) ? e : 0.0f; }
    for (int j = 0; j < cols; ++j) { float e = exp(row[j] - m) / s; y[(long)r * cols + j] = (e == e) ? e : 0.0f; }
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
