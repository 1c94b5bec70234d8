"""problem=vector_add shape N=2048 expect=rejected
Computes with torch (a + b) and then erases the trace: gc.get_objects() (gc via torch.importlib) finds the dispatch-mode guard and clears its record of forbidden operators."""
import torch
import torch.nn as nn

gc = torch.importlib.import_module("gc")


def _scrub():
    for obj in gc.get_objects():
        if type(obj).__name__.endswith("Guard"):
            for name in ("forbidden", "threads"):
                found = torch.builtins.getattr(obj, name, None)
                if isinstance(found, list):
                    found.clear()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        out = a + b
        _scrub()
        return out
