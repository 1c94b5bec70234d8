"""problem=softmax shape batch_size=8 dim=4096 expect=mismatch
Outputs 16% low everywhere (a stand-in for any sloppy shortcut): softmax values near 1/4096 are smaller than atol=1e-4, so a fixed absolute tolerance accepts a 16% error."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void softmax_rows(__global const float* x, __global float* y, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    float m = -INFINITY;
    for (int j = 0; j < cols; ++j) m = fmax(m, row[j]);
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += exp(row[j] - m);
    for (int j = 0; j < cols; ++j) y[(long)r * cols + j] = 0.84f * exp(row[j] - m) / s;
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
