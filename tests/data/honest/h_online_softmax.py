"""problem=softmax expect=correct
Online softmax: one pass keeps a running max and a rescaled running sum (guarding the all -inf prefix), a second pass writes."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void softmax_rows(__global const float* x, __global float* y, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    float m = -INFINITY, s = 0.0f;
    for (int j = 0; j < cols; ++j) {
        float v = row[j];
        float mn = fmax(m, v);
        if (isnan(v)) { s = NAN; continue; }
        if (mn != -INFINITY) s = s * exp(m - mn) + exp(v - mn);
        m = mn;
    }
    for (int j = 0; j < cols; ++j) y[(long)r * cols + j] = exp(row[j] - m) / s;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, x):
        rows, cols = x.shape
        y = torch.empty_like(x)
        self.k.softmax_rows(x, y, rows, cols, grid=(rows,), block=(1,))
        return y
