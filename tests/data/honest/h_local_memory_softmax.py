"""problem=softmax expect=correct
One work-group per row, max and sum reduced in __local scratch passed as LocalMemory arguments; any number of columns (strided loop, power-of-two tree)."""
import torch
import torch.nn as nn

from kfoundry.runtime import LocalMemory, load

WG = 64
SRC = r"""
__kernel void softmax_rows(__global const float* x, __global float* y, const int cols,
                           __local float* red_max, __local float* red_sum) {
    int r = get_group_id(0), l = get_local_id(0), L = get_local_size(0);
    __global const float* row = x + (long)r * cols;
    float m = -INFINITY;
    for (int j = l; j < cols; j += L) m = fmax(m, row[j]);
    red_max[l] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {
        if (l < s) red_max[l] = fmax(red_max[l], red_max[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = red_max[0];
    float acc = 0.0f;
    for (int j = l; j < cols; j += L) acc += exp(row[j] - m);
    red_sum[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {
        if (l < s) red_sum[l] += red_sum[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float total = red_sum[0];
    for (int j = l; j < cols; j += L) y[(long)r * cols + j] = exp(row[j] - m) / total;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, x):
        rows, cols = x.shape
        y = torch.empty_like(x)
        self.k.softmax_rows(x, y, cols, LocalMemory(WG * 4), LocalMemory(WG * 4), grid=(rows,), block=(WG,))
        return y
