"""The split reductions' float4 rows (``lower_split._Quads``): a term's buffer loads that read four
consecutive elements of a row become 16-byte loads issued before the term's math, misaligned rows and
the ``n % 4`` tail take the scalar loop, a load the term guards (a cat operand shorter than the row)
stays scalar. Run on PoCL against PyTorch in float64 at odd sizes; the CUDA pieces compiled for sm_90
(no spills) at the real KernelBench sizes.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from tests.offline_helpers import run_against_float64

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

#: sum of a cat (operands shorter than the row: their loads are guarded) times a full-row tensor
CAT = """import torch
import torch.nn as nn

batch_size = 23
n0 = 301
n1 = 403


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b, c):
        return torch.sum(torch.cat([a, b], dim=1) * c)


def get_inputs():
    return [torch.randn(batch_size, n0), torch.randn(batch_size, n1), torch.randn(batch_size, n0 + n1)]


def get_init_inputs():
    return []
"""

ODD = [
    # rows of 1002: every other row 16-byte aligned (float4 then a 2-term tail), the rest scalar;
    # the targets broadcast along the row (one 1-D leaf, always aligned)
    ("level1/hinge_loss.py", {"batch_size": 1002, "dim": 1002}),
    # rows of 1003 (a 3-term tail), two leaves under the term's branch (target > 0)
    ("level1/kl_div_loss.py", {"batch_size": 13, "dim": 1003}),
    # rows of 1024: every row aligned, no tail; three softplus terms
    ("level1/binary_cross_entropy_losses.py", {"batch_size": 11, "classes": 1024}),
    ("level1/mse_loss.py", {"batch_size": 9, "dim": 2050}),
]


@pytest.fixture(scope="module")
def _pocl(pocl_runtime: None) -> None:
    """The kernels of the tests that run them run on PoCL."""


def _recipe(problem: Any, lang: str, name: str = "graph/fused_coop") -> Any:
    return cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), lang, name, 1)


def _piece(kernel: str) -> str:
    """The stage-1 kernel's text."""
    m = re.search(r"KF_KERNEL k\d+_\w*gpart\(.*?\n}\n", kernel, re.S)
    assert m is not None
    return m.group(0)


@pytest.mark.parametrize("name", ["graph/fused", "graph/fused_coop", "graph/unfused"])
@pytest.mark.parametrize(("key", "dims"), ODD)
def test_float4_rows_match_float64_at_odd_sizes(
    _pocl: None, key: str, dims: dict[str, int], name: str
) -> None:
    problem = load_problem(DATA / key, dims)
    recipe = _recipe(problem, "opencl", name)
    assert "vload4(0, kf_p0 + kf_i)" in _piece(recipe.kernel)
    got, expected = run_against_float64(problem, recipe)
    err = ((got - expected).abs() / (expected.abs() + 1e-3)).max().item()
    assert err < 1e-5, f"{key} {name}: max relative error {err}"


def test_guarded_short_leaves_stay_scalar(_pocl: None, tmp_path: Path) -> None:
    path = tmp_path / "cat_sum.py"
    path.write_text(CAT)
    problem = load_problem(path, None)
    recipe = _recipe(problem, "opencl")
    piece = _piece(recipe.kernel)
    # c (the full row) reads as float4 (its bounds checked in forward); a and b, under the cat's guard,
    # stay scalar loads
    assert "vload4(0, kf_p0 + kf_i)" in piece and "kf_p1" not in piece
    checks = [ln for ln in recipe.forward.splitlines() if re.match(r"V\d+ = ", ln)]
    assert len(checks) == 1 and "S2[1]" in checks[0]
    got, expected = run_against_float64(problem, recipe)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "key", ["level1/kl_div_loss.py", "level1/hinge_loss.py", "level1/binary_cross_entropy_losses.py"]
)
def test_cuda_pieces_load_16_bytes_without_spills(key: str, tmp_path: Path) -> None:
    from offline_helpers import nvcc_resources

    recipe = _recipe(load_problem(DATA / key, None), "cuda")
    piece = _piece(recipe.kernel)
    assert "reinterpret_cast<KF_G const float4*>(kf_p0 + kf_i)" in piece
    assert "__shfl_xor_sync" in piece  # warp folds, not a BLOCK-sized local-memory tree
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    report = nvcc_resources(recipe.kernel, recipe.defaults, tmp_path)
    used = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert used and all(a == "0" and b == "0" for a, b in used), report
