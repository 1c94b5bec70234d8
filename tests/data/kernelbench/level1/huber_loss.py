# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import torch
import torch.nn as nn
from torch.distributions import Pareto

batch_size = 32768
input_shape = (32768,)
dim = 1


class Model(nn.Module):
    """A model that computes the Huber loss."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.huber_loss(predictions, targets, delta=0.5)


def get_inputs():
    return [Pareto(0.01, 1.5, validate_args=False).sample((batch_size, *input_shape)) * torch.rand(()), Pareto(0.01, 1.5, validate_args=False).sample((batch_size, *input_shape))]


def get_init_inputs():
    return []
