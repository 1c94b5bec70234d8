"""problem=softmax expect=correct
forward takes a parameter named input (shadowing the builtin, as many PyTorch models do); naive row softmax."""
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
    for (int j = 0; j < cols; ++j) y[(long)r * cols + j] = exp(row[j] - m) / s;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, input):
        output = torch.empty_like(input)
        rows, cols = input.shape
        self.k.softmax_rows(input, output, rows, cols, grid=(rows,), block=(1,))
        return output
