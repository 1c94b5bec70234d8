import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
in_features = 32768
out_features = 32768
scaling_factor = 2.0


class Model(nn.Module):
    """Linear, swish, scaling."""

    def __init__(self, in_features, out_features, scaling_factor):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.matmul(x)
        x = x * torch.sigmoid(x)
        return x * self.scaling_factor


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scaling_factor]
