"""problem=softmax shape batch_size=4096 dim=4096 expect=mismatch
Divides by the expected row sum of exp(x - max) for U[0,1) inputs, dim * (1 - 1/e), instead of computing it: outputs near 2.4e-4 sit under an absolute tolerance of 1e-4."""
import torch
import torch.nn as nn

from kfoundry.runtime import load

SRC = r"""
extern "C" __global__ void softmax_rows(const float* x, float* y, int rows, int cols) {
    int r = blockIdx.x;
    const float* row = x + (long long)r * cols;
    __shared__ float red[256];
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
    red[threadIdx.x] = m; __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) { if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]); __syncthreads(); }
    m = red[0];
    float sum = cols * (1.0f - expf(-1.0f)) * expf(1.0f - m);
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
