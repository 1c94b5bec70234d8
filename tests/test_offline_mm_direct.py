"""Plain linear layers of ``graph/fused_coop`` on sgemm_warp's own kernels (:mod:`.lower_mm_direct`): which
layers take them, and the rendered model against eager PyTorch on the CPU emulation of
``test_offline_cuda_emulated`` (g++ C++20) at shapes off the tile (ragged M and N, K not a multiple of 4:
the 4-byte kernel; K a multiple of 4: the 16-byte one), with and without a bias, the input 3-D, and a
second layer whose input has a prologue (the graph's own warp tiles)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import test_offline_cuda_emulated as emu
import torch

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import lower_mm_direct, lower_mm_warp
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from tests.offline_helpers import run_against_eager

DATA = Path(__file__).resolve().parent / "data" / "kernelbench" / "level2"

#: problem, shape, the launches its forward must hold
CASES: list[tuple[str, dict[str, int], tuple[str, ...]]] = [
    # no bias (the model adds its own parameter), K = 21: the 4-byte kernel, 130 x 200 off the 128 x 256 tile
    (
        "gemm_add_relu.py",
        {"batch_size": 130, "in_features": 21, "out_features": 200},
        ("self.prog.matmul_u",),
    ),
    # nn.Linear's bias added on store, then the row's layer norm; K = 36: the 16-byte kernel
    (
        "gemm_functional_layer_norm.py",
        {"batch_size": 5, "in_features": 36, "out_features": 500},
        ("self.prog.matmul_b ",),
    ),
    # a 3-D input: M is batch x sequence
    (
        "linear3d_transpose_mean.py",
        {"batch_size": 3, "in_features": 20, "out_features": 250, "seq_len": 7},
        ("self.prog.matmul_b ",),
    ),
    # the first layer direct, the second reads relu(first): a prologue, so the graph's own tiles
    (
        "linear_sequential_relu_linear.py",
        {"batch_size": 9, "in_features": 16, "out_features": 250},
        ("self.prog.matmul_b ", "_lintile("),
    ),
]


def _recipe(key: str, shape: dict[str, int]) -> tuple[Any, Any]:
    problem = load_problem(DATA / key, shape)
    recipe = next(
        r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == "graph/fused_coop"
    )
    return problem, recipe


def test_only_wide_products_take_the_kernels() -> None:
    """At the default threshold a small product keeps the graph's kernels; a full-size one takes sgemm_warp's."""
    _, small = _recipe("gemm_add_relu.py", {"batch_size": 130, "in_features": 21, "out_features": 250})
    assert "sgemm_warp's kernels" not in small.kernel
    # enough tiles, but a narrow N: the graph's narrower tile wastes less (65536 x 10: 6% of a 256-wide tile)
    _, narrow = _recipe("gemm_add_relu.py", {"batch_size": 65536, "in_features": 64, "out_features": 10})
    assert "sgemm_warp's kernels" not in narrow.kernel
    _, full = _recipe("gemm_add_relu.py", {})
    assert "sgemm_warp's kernels" in full.kernel and "self.prog.matmul" in full.forward


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("key", "shape", "calls"), CASES, ids=[c[0] for c in CASES])
def test_direct_linear_matches_eager_on_the_cpu_emulation(
    key: str, shape: dict[str, int], calls: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "load", emu.emu_load)
    monkeypatch.setattr(lower_mm_direct, "MIN_TILES", 0)
    monkeypatch.setattr(lower_mm_warp, "MIN_TILES", 0)
    problem, recipe = _recipe(key, shape)
    for call in calls:
        assert call in recipe.forward or call in recipe.kernel, (key, call)
    got, expected = run_against_eager(problem, recipe)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


#: problem and shape of the split-K cases (few output tiles, a long K)
SPLIT_CASES: list[tuple[str, dict[str, int]]] = [
    # nn.Linear's bias added by the slices' sum; K = 2054: the 4-byte kernel, four slices, the last ragged
    ("gemm_functional_layer_norm.py", {"batch_size": 5, "in_features": 2054, "out_features": 300}),
    # no bias; K = 4096: the 16-byte kernel, eight slices of 512
    ("gemm_add_relu.py", {"batch_size": 7, "in_features": 4096, "out_features": 130}),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("key", "shape"), SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_few_tiles_split_k_matches_eager_on_the_cpu_emulation(
    key: str, shape: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too few tiles to fill the GPU (here: fewer than 8) and a K long enough that the tiles' slices do:
    K's slices into a workspace, then the sum kernel (with the bias). A K too short to split, or one whose
    slices would still leave the GPU idle, keeps the graph's own kernels."""
    monkeypatch.setattr(runtime, "load", emu.emu_load)
    monkeypatch.setattr(lower_mm_direct, "MIN_TILES", 8)
    problem, recipe = _recipe(key, shape)
    assert "matmul_sum" in recipe.forward and "torch.empty((Z" in recipe.forward, key
    for k in (2 * lower_mm_direct.SPLIT_MIN_K - 4, 2 * lower_mm_direct.SPLIT_MIN_K):  # too short; too few
        assert "sgemm_warp's kernels" not in _recipe(key, {**shape, "in_features": k})[1].kernel, k
    got, expected = run_against_eager(problem, recipe)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
