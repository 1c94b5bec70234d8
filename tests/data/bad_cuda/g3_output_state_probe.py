"""problem=softmax shape batch_size=4096 dim=4096 expect=mismatch|rejected
Reads its own fresh output first: NaN there means a checked call (outputs poisoned), anything else a timed call, where it computes only the first 64 rows."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
extern "C" __global__ void softmax_rows(const float* x, float* y, int rows, int cols) {
    int r = blockIdx.x;
    bool checked = isnan(y[0]);
    if (!checked && r >= 64) return;
    const float* row = x + (long long)r * cols;
    __shared__ float red[256];
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
    red[threadIdx.x] = m; __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]); __syncthreads(); }
    m = red[0]; __syncthreads();
    float sum = 0.f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(row[j] - m);
    red[threadIdx.x] = sum; __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s]; __syncthreads(); }
    sum = red[0];
    for (int j = threadIdx.x; j < cols; j += blockDim.x) y[(long long)r * cols + j] = expf(row[j] - m) / sum;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, x):
        y = torch.empty_like(x)
        rows, cols = x.shape
        self.k.softmax_rows(x, y, rows, cols, grid=(rows,), block=(256,))
        return y
