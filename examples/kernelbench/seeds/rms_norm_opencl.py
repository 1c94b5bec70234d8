import torch
import torch.nn as nn

from kfoundry.runtime import load

# Naive: one work-item per row.
SRC = r"""
__kernel void rms_norm(__global const float* x, __global float* y, const int rows, const int cols, const float eps) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    float ss = 0.0f;
    for (int j = 0; j < cols; ++j) ss += row[j] * row[j];
    float inv = 1.0f / sqrt(ss / cols + eps);
    for (int j = 0; j < cols; ++j) y[(long)r * cols + j] = row[j] * inv;
}
"""


class ModelNew(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.eps = eps
        self.k = load(SRC, defines=PARAMS)

    def forward(self, x):
        y = torch.empty_like(x)
        rows, cols = x.shape
        self.k.rms_norm(x, y, rows, cols, float(self.eps), grid=(rows,), block=(1,))
        return y
