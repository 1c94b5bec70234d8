import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 64
features = 64
dim1 = 512
dim2 = 512


class Model(nn.Module):
    """Batch normalisation (training mode: batch statistics)."""

    def __init__(self, num_features):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.rand(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [features]
