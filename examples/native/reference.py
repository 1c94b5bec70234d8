"""Reference functions of the native tasks: inputs in declared order -> outputs in declared order."""

import torch


def vector_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=1)
