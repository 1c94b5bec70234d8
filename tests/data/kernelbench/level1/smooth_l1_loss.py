import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Pareto

batch_size = 32768
dim = 32768


class Model(nn.Module):
    """Smooth L1 (Huber) loss."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.smooth_l1_loss(predictions, targets)


def get_inputs():
    return [Pareto(0.01, 1.5, validate_args=False).sample((batch_size, dim)) * torch.rand(()), Pareto(0.01, 1.5, validate_args=False).sample((batch_size, dim))]


def get_init_inputs():
    return []
