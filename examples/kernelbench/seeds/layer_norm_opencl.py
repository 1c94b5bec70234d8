import torch
import torch.nn as nn

from kfoundry.runtime import load

# Naive: one work-item per row; mean, then variance, then normalise.
SRC = r"""
__kernel void layer_norm(__global const float* x, __global const float* w, __global const float* b,
                         __global float* y, const int rows, const int cols, const float eps) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global const float* row = x + (long)r * cols;
    float mean = 0.0f;
    for (int j = 0; j < cols; ++j) mean += row[j];
    mean /= cols;
    float var = 0.0f;
    for (int j = 0; j < cols; ++j) { float d = row[j] - mean; var += d * d; }
    var /= cols;
    float inv = 1.0f / sqrt(var + eps);
    for (int j = 0; j < cols; ++j) y[(long)r * cols + j] = (row[j] - mean) * inv * w[j] + b[j];
}
"""


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ln = nn.LayerNorm(features)
        self.k = load(SRC, defines=PARAMS)

    def forward(self, x):
        y = torch.empty_like(x)
        rows, cols = x.shape
        self.k.layer_norm(x, self.ln.weight, self.ln.bias, y, rows, cols, float(self.ln.eps), grid=(rows,), block=(1,))
        return y
