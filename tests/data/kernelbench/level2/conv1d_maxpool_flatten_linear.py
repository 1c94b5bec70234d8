import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 1024
in_channels = 32
out_channels = 64
length = 512
kernel_size = 3
out_features = 1024


class Model(nn.Module):
    """Conv1d, ReLU, max pool, flatten, linear."""

    def __init__(self, in_channels, out_channels, kernel_size, length, out_features):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=1)
        self.pool = nn.MaxPool1d(2)
        self.fc = nn.Linear(out_channels * (length // 2), out_features)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv(x)))
        x = x.view(x.size(0), -1)
        return self.fc(x)


def get_inputs():
    return [torch.rand(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, length, out_features]
