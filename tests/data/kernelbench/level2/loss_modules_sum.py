import torch
import torch.nn as nn

batch_size = 32768
num_classes = 4096
dim = 8192


class Model(nn.Module):
    """A sum of loss modules: cross-entropy, Huber, KL divergence (batch mean), MSE."""

    def __init__(self):
        super().__init__()
        self.ce = nn.CrossEntropyLoss()
        self.h = nn.HuberLoss(delta=0.5, reduction="sum")
        self.kl = nn.KLDivLoss(reduction="batchmean")
        self.mse = nn.MSELoss()

    def forward(self, x, t, a, b):
        return self.ce(x, t) + self.h(a, b) + self.kl(torch.log(a.softmax(-1)), b.softmax(-1)) + self.mse(a, b)


def get_inputs():
    return [
        torch.rand(batch_size, num_classes),
        torch.randint(0, num_classes, (batch_size,)),
        torch.randn(batch_size, dim),
        torch.randn(batch_size, dim),
    ]


def get_init_inputs():
    return []
