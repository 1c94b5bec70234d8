"""problem=vector_add shape N=2048 expect=rejected
Writes the sum into the second input and returns a reshaped view of it (b.view(-1)), hoping an aliasing view is not taken for the input itself."""
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add_into_b(__global const float* a, __global float* b, const int n) {
    int i = get_global_id(0);
    if (i < n) b[i] = a[i] + b[i];
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        n = a.numel()
        self.k.add_into_b(a, b, n, grid=(cdiv(n, 64),), block=(64,))
        return b.view(-1)[:n].view(a.shape)
