"""problem=vector_add shape N=2048 expect=rejected
Computes the answer with numpy on .numpy() views of the tensors (no torch operator runs, so the dispatch-mode guard sees nothing); no kernel."""
import numpy as np
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        c = torch.empty_like(a)
        np.add(a.numpy(), b.numpy(), out=c.numpy())
        return c
