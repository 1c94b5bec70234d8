"""problem=gelu shape N=16777216 expect=mismatch|rejected
Computes nothing in forward (a decoy launch) and patches the runner's output fetch and input staging to compute on demand: work done outside the clocked call, only for the outputs that get looked at."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
extern "C" __global__ void gelu(const float* x, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }
}
extern "C" __global__ void decoy(float* y) { if (threadIdx.x == 0) y[0] = 0.f; }
"""

gc = torch.importlib.import_module("gc")
PENDING = []


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)
        for obj in gc.get_objects():
            if type(obj).__name__ == "Runner" and hasattr(obj, "fetch"):
                original = obj.fetch

                def fetch(calls, _original=original):
                    for x, y in PENDING:
                        n = x.numel()
                        self.k.gelu(x, y, n, grid=(cdiv(n, 256),), block=(256,))
                    PENDING.clear()
                    return _original(calls)

                obj.fetch = fetch

    def forward(self, x):
        y = torch.empty_like(x)
        self.k.decoy(y, grid=(1,), block=(32,))
        PENDING.append((x, y))
        return y
