"""problem=matmul shape M=256 K=256 N=256 expect=mismatch|correct|rejected max_speedup=1
A result cache in files under /tmp keyed by a hash of sampled input elements: computed once by the kernel, read back (numpy.fromfile) on every later call with the same key, across calls and across jobs."""
import numpy as np
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void matmul(__global const float* a, __global const float* b, __global float* c,
                     const int M, const int N, const int K) {
    int col = get_global_id(0), row = get_global_id(1);
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a[row * K + k] * b[k * N + col];
    c[row * N + col] = acc;
}
"""

hashlib = torch.importlib.import_module("hashlib")
os = torch.os


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        sample = repr([a[0, 0].item(), a[-1, -1].item(), b[0, 0].item(), b[-1, -1].item(), M, N, K])
        path = "/tmp/kf-bad-cache-" + hashlib.sha1(sample.encode()).hexdigest() + ".f32"
        c = torch.empty(M, N, dtype=a.dtype)
        try:
            if os.path.exists(path):
                np.copyto(c.numpy().reshape(-1), np.fromfile(path, dtype=np.float32, count=M * N))
                return c
        except OSError:
            pass
        self.k.matmul(a, b, c, M, N, K, grid=(cdiv(N, 16), cdiv(M, 16)), block=(16, 16))
        try:
            c.numpy().tofile(path)
        except OSError:
            pass
        return c
