import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
dim = 1


class Model(nn.Module):
    """Hinge loss."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randint(0, 2, (batch_size, dim)).float() * 2 - 1]


def get_init_inputs():
    return []
