"""problem=vector_add shape N=2048 expect=rejected
Finds the guard class among TorchDispatchMode.__subclasses__() (computed names, no import of the harness) and replaces its __torch_dispatch__ with a silent pass-through, then computes with torch."""
import torch
import torch.nn as nn

_get = torch.builtins.getattr
_mode = _get(_get(torch.utils, "_python" + "_dispatch"), "TorchDispatchMode")


def _passthrough(self, func, types, args=(), kwargs=None):
    return func(*args, **(kwargs or {}))


for _cls in _get(_mode, "__subcl" + "asses__")():
    if "Guard" in _cls.__name__:
        type.__setattr__(_cls, "__torch" + "_dispatch__", _passthrough)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b
