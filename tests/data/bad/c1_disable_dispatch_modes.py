"""problem=vector_add shape N=2048 expect=rejected
Computes with torch under torch.utils._python_dispatch._disable_current_modes(), reached with computed attribute names, so the dispatch-mode guard never sees the add."""
import torch
import torch.nn as nn

_get = torch.builtins.getattr
_disable = _get(_get(torch.utils, "_python" + "_dispatch"), "_disable" + "_current_modes")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        with _disable():
            return a + b
