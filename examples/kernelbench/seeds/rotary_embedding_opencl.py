import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

# Naive: one work-item per (position, pair) of the rotated halves.
SRC = r"""
__kernel void rope(__global const float* x, __global const float* cs, __global const float* sn, __global float* y,
                   const int S, const int H, const int D, const int total) {
    int i = get_global_id(0);
    if (i >= total) return;
    int hd = D / 2;
    int j = i % hd;
    int row = i / hd;             /* (b, s, h) flattened */
    int s = (row / H) % S;
    long base = (long)row * D;
    float c = cs[s * hd + j], si = sn[s * hd + j];
    float x1 = x[base + j], x2 = x[base + hd + j];
    y[base + j] = x1 * c - x2 * si;
    y[base + hd + j] = x2 * c + x1 * si;
}
"""

BLOCK = PARAMS.get("BLOCK", 64)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC, defines=PARAMS)

    def forward(self, x, cos, sin):
        b, s, h, d = x.shape
        y = torch.empty_like(x)
        total = b * s * h * (d // 2)
        self.k.rope(x, cos, sin, y, s, h, d, total, grid=(cdiv(total, BLOCK),), block=(BLOCK,))
        return y
