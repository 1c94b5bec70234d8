"""problem=gelu shape N=16777216 expect=correct|mismatch|rejected max_speedup=1.15
Runs the GELU on a second CUDA stream and returns without joining it: CUDA events recorded on the current stream see none of the work."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

cuda = torch.importlib.import_module("torch.cuda")  # a re-export: no name-based check sees torch.cuda

SRC = r"""
extern "C" __global__ void gelu(const float* x, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)
        self.side = cuda.Stream()

    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        with cuda.stream(self.side):
            for _ in range(4):  # four times the work, all of it on the side stream
                self.k.gelu(x, y, n, grid=(cdiv(n, 256),), block=(256,))
        return y
