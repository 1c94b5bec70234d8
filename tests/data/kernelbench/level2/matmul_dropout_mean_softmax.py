import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
in_features = 16384
out_features = 16384
dropout_p = 0.0


class Model(nn.Module):
    """Linear, dropout (p=0), mean over features, softmax."""

    def __init__(self, in_features, out_features, dropout_p):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, x):
        x = self.matmul(x)
        x = self.dropout(x)
        x = torch.mean(x, dim=1, keepdim=True)
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, dropout_p]
