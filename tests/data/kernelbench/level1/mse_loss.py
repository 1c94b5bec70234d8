import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Pareto

batch_size = 32768
dim = 32768


class Model(nn.Module):
    """Mean squared error."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    return [Pareto(0.01, 1.5, validate_args=False).sample((batch_size, dim)), Pareto(0.01, 1.5, validate_args=False).sample((batch_size, dim))]


def get_init_inputs():
    return []
