"""The sum-of-an-affine-product rewrite's numerics at full KernelBench size, on the CPU: eager's
(matmul, then sum) and the rewrite's (the weight summed in the column kernel's order, then a
matrix-vector product) errors against float64, and both verdicts of the table's check.

    python benchmarks/rewrite_numerics.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernelbench_run import close, float64_truth  # noqa: E402

M, K, N = 1024, 8192, 8192  # matmul_divide_sum_scaling's batch_size, input_size, hidden_size
PIECES = 32  # the column kernel's pieces per output at N = 8192 (lower_split.COLUMN_THREADS / K)


class Reference(torch.nn.Module):
    """matmul_divide_sum_scaling's forward."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(torch.matmul(x, self.weight.T) / 2, dim=1, keepdim=True) * 1.5


def main() -> None:
    torch.manual_seed(0)
    weight, x = torch.randn(N, K), torch.rand(M, K)
    ref = Reference(weight)
    with torch.no_grad():
        eager = ref(x)
        v = weight.reshape(PIECES, N // PIECES, K).sum(1).sum(0) * 0.5
        rewritten = (x @ v).unsqueeze(-1) * 1.5
    truth = float64_truth(ref, [x])
    t64 = truth()
    print("| output | max error vs float64 | within 1e-3 of eager | judged against float64 |")
    print("|---|---|---|---|")
    for name, out in (("eager", eager), ("rewrite", rewritten)):
        err = (out.double() - t64).abs().max().item()
        print(f"| {name} | {err:.4g} | {close(out, eager)[0]} | {close(out, eager, truth)[0]} |")


if __name__ == "__main__":
    main()
