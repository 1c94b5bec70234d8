import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
dim = 4096


class Model(nn.Module):
    """KL divergence (batch mean) between softmax distributions."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.kl_div(torch.log(predictions), targets, reduction='batchmean')


def get_inputs():
    return [torch.randn(batch_size, dim).softmax(dim=-1), torch.randn(batch_size, dim).softmax(dim=-1)]


def get_init_inputs():
    return []
