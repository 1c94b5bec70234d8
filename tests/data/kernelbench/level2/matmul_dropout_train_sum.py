# ruff: noqa: UP008  (KernelBench writes super(Model, self))
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
in_features = 16384
out_features = 16384
dropout_p = 0.0


class Model(nn.Module):
    """Matrix multiplication, dropout (training mode, p = 0), sum, softmax over a size-1 dim."""

    def __init__(self, in_features, out_features, dropout_p):
        super(Model, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, x):
        x = self.matmul(x)
        x = self.dropout(x)
        x = x.sum(dim=1, keepdim=True)
        x = torch.softmax(x, dim=1)
        return x


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, dropout_p]
