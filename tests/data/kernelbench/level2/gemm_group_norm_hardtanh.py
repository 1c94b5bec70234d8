import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 1024
in_features = 8192
out_features = 8192
num_groups = 16


class Model(nn.Module):
    """Linear, group norm, hardtanh."""

    def __init__(self, in_features, out_features, num_groups):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.hardtanh = nn.Hardtanh(min_val=-2.0, max_val=2.0)

    def forward(self, x):
        x = self.gemm(x)
        x = self.group_norm(x)
        return self.hardtanh(x)


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]
