"""Log-sum-exp rows of the offline lowering on PoCL against PyTorch: the cooperative schedule's warp per
row (eight terms per lane each step, the running max and sum rescaled once per step) and the other
schedules; ragged lengths, a reduced dim that is not innermost, keepdim, and rows with NaN, +inf, -inf
(all of a row and some of it) and a max that grows along the row."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_offline_scan_reverse import SCHEDULES, build, problem_file, run


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def special_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` (rows along ``dim``) with NaN, +inf, -inf rows and growing values in some rows."""
    x = x.movedim(dim, -1).clone()
    n = x.shape[-1]
    x[0] = float("-inf")  # every term -inf: -inf
    x[1, n // 2] = float("nan")  # NaN
    x[2, n - 1] = float("inf")  # +inf: inf
    x[3, : n // 3] = float("-inf")  # some -inf
    x[4] = torch.linspace(-30.0, 30.0, n)  # the max grows along the row
    x[5, 1] = float("inf")
    x[5, 3] = float("nan")  # NaN beats inf
    x[6, ::7] = float("-inf")
    x[6, n - 1] = 50.0  # the last term dominates
    return x.movedim(-1, dim).contiguous()


CASES = [
    ("torch.logsumexp(x, dim=1)", (8, 301), 1),  # ragged: 301 is no multiple of 32 * 8
    ("torch.logsumexp(x, dim=-1, keepdim=True) + 1.0", (9, 1000), 1),
    ("torch.logsumexp(x, dim=0)", (257, 8), 0),  # the reduced dim is not innermost
    ("torch.logsumexp(x * 3.0, dim=1)", (7, 5), 1),  # shorter than a warp
]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize(("forward", "shape", "dim"), CASES)
def test_logsumexp_matches_torch(
    forward: str, shape: tuple[int, ...], dim: int, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = problem_file(tmp_path, forward, shape)
    recipe = build(problem, name, monkeypatch)
    if name == "graph/fused_coop":
        assert "kv[u]" in recipe.kernel and "kf_wmax" in recipe.kernel
    torch.manual_seed(0)
    x = 4.0 * torch.randn(shape)
    if shape[dim] >= 7 and math.prod(shape) // shape[dim] >= 7:
        x = special_rows(x, dim)
    got, expected = run(problem, recipe, [x])
    assert torch.equal(got.isnan(), expected.isnan()), f"{forward} {name}: NaN positions"
    inf = expected.isinf()
    assert torch.equal(got[inf], expected[inf]), f"{forward} {name}: infinities"
    fin = ~(inf | expected.isnan())
    err = ((got[fin] - expected[fin]).abs() / (expected[fin].abs() + 1e-2)).max().item()
    assert err < 1e-5, f"{forward} {name}: max relative error {err}"
