# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import torch
import torch.nn as nn
from torch.distributions import Normal, Pareto

batch_size = 32768
features = 32768


class Model(nn.Module):
    """Mean absolute error over heavy-tailed inputs drawn from ``torch.distributions`` in
    ``get_inputs`` (KernelBench's loss problems sample Pareto inputs so that a partial sum is caught)."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, predictions, targets):
        return torch.mean(torch.abs(predictions - targets))


def get_inputs():
    predictions = Pareto(0.05, 1.75).sample((batch_size, features))
    targets = Normal(0.5, 2.0).sample((batch_size, features))
    return [predictions, targets]


def get_init_inputs():
    return []
