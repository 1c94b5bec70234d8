"""problem=softmax shape batch_size=8 dim=4096 expect=mismatch
exp replaced by a cubic Taylor polynomial, accurate only near [0,1) where U[0,1) inputs live (no max subtraction either); wrong by orders of magnitude for signed or large inputs."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
inline float exp01(float v) { return 1.0f + v * (1.0f + v * (0.5f + v * (1.0f / 6.0f))); }
__kernel void softmax_rows(__global const float* x, __global float* y, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += exp01(row[j]);
    float inv = 1.0f / s;
    for (int j = 0; j < cols; ++j) y[(long)r * cols + j] = exp01(row[j]) * inv;
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
