"""problem=vector_add shape N=2048 expect=rejected
Adds 'add' to the guard module's ALLOWED_OPS set (a method call, no assignment), then computes with torch in forward."""
import torch
import torch.nn as nn

guard = torch.importlib.import_module("kfoundry.core.evaluation.guard")
guard.ALLOWED_OPS.update({"add", "add_", "mul", "softmax", "_softmax", "mm", "matmul"})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b
