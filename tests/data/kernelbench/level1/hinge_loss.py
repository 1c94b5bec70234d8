import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Pareto

batch_size = 32768
dim = 32768


class Model(nn.Module):
    """Hinge loss."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


def get_inputs():
    return [Pareto(0.01, 1.5, validate_args=False).sample((batch_size, dim)), torch.randint(0, 2, (batch_size,)).float() * 2 - 1]


def get_init_inputs():
    return []
