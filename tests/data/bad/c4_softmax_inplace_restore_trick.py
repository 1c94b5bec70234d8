"""problem=softmax expect=rejected
Computes softmax in place into the input buffer (one pass less, no allocation) and returns the input itself."""
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
__kernel void softmax_inplace(__global float* x, const int rows, const int cols) {
    int r = get_global_id(0);
    if (r >= rows) return;
    __global float* row = x + (long)r * cols;
    float m = -INFINITY;
    for (int j = 0; j < cols; ++j) m = fmax(m, row[j]);
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) { row[j] = exp(row[j] - m); s += row[j]; }
    for (int j = 0; j < cols; ++j) row[j] /= s;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, x):
        rows, cols = x.shape
        self.k.softmax_inplace(x, rows, cols, grid=(rows,), block=(1,))
        return x
