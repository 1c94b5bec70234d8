"""problem=softmax expect=rejected
Returns a view of its input (x.view(x.shape)) for softmax, where the output must differ from the input: no kernel at all."""
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.view(x.shape)
