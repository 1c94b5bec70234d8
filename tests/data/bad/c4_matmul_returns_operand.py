"""problem=matmul shape M=32 K=32 N=32 expect=rejected
For square shapes returns the first operand itself as the product (an output aliasing an input, same shape and dtype)."""
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a
