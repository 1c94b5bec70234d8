"""The implicit-GEMM convolution's 128 x 256 tiles (CM 8, CN 16: 8 x 16 outputs per thread).

At full KernelBench sizes the 128-channel convolutions take them (:func:`.lower_conv.conv_blocks`); the
PoCL cases force them at small shapes (plain, transposed with its phase decomposition, a fused epilogue,
the conv -> global-mean partial sums), and the CUDA kernels are compiled for sm_90: dynamic shared memory
past the static 48 KB, one 256-thread block per SM, no spills.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from offline_helpers import nvcc_resources, run_against_eager

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph, lower_conv, lower_conv_pool
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())
WIDE = {"CM": 8, "CN": 16}

_SLOW = pytest.mark.slow
CASES = [
    "level1/conv2d_square.py",
    pytest.param("level1/conv_transpose1d.py", marks=_SLOW),
    pytest.param("level1/conv_transpose2d.py", marks=_SLOW),
    pytest.param("level1/conv_transpose2d_strided_dilated.py", marks=_SLOW),
    pytest.param("level1/conv2d_grouped.py", marks=_SLOW),
    pytest.param("level1/conv3d.py", marks=_SLOW),
    pytest.param("level2/conv2d_tanh_scaling_bias_maxpool.py", marks=_SLOW),
]


def _error(key: str, shape: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> tuple[str, float, float]:
    """(kernel source, max error, max magnitude) of the fused recipe of ``key`` at CM 8, CN 16 on PoCL."""
    monkeypatch.setattr(lower_conv, "MIN_ROWS", 1)  # small shapes: every convolution as a GEMM
    problem = load_problem(DATA / key, shape)
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", "graph/fused", 1)
    got, expected = run_against_eager(problem, recipe, {**recipe.defaults, **WIDE})
    return recipe.kernel, (got - expected).abs().max().item(), expected.abs().max().item()


@pytest.mark.parametrize("key", CASES)
def test_wide_tiles_match_eager_on_pocl(
    key: str, pocl_runtime: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel, err, scale = _error(key, SMALL.get(key, {}), monkeypatch)
    assert "convgemm" in kernel
    assert err <= 1e-4 * max(1.0, scale), f"{key}: max error {err}"


@pytest.mark.slow
def test_wide_tiles_fold_the_global_mean_on_pocl(pocl_runtime: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lower_conv_pool, "MIN_POSITIONS", 1)
    mid = {"batch_size": 2, "in_channels": 3, "out_channels": 8, "height": 96, "width": 96}
    kernel, err, scale = _error("level2/conv2d_gelu_global_avgpool.py", mid, monkeypatch)
    assert "psum" in kernel  # the conv writes per-tile partial sums, never its output
    assert err <= 1e-4 * max(1.0, scale), f"max error {err}"


def test_wide_tiles_are_chosen_for_large_products_only() -> None:
    # KernelBench's 128-channel convolutions: far more than four waves of 128 x 256 tiles
    assert lower_conv.conv_blocks([(128, 1 << 20, 16)]) == (8, 16)
    assert lower_conv.conv_blocks([(128, 128 * 128, 128)]) == (8, 16)
    # fewer than MIN_WIDE_TILES of them: the 128 x 64 tiles, two blocks per SM
    assert lower_conv.conv_blocks([(128, 64 * 64, 8)]) == (8, 4)
    # up to 96 channels per group: unchanged (a 128-row tile would be half empty)
    assert lower_conv.conv_blocks([(64, 1 << 20, 8)]) == (4, 8)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize(
    "key", ["level1/conv2d_square.py", "level2/conv_transpose2d_softmax_sigmoid.py", "level1/conv1d.py"]
)
def test_wide_tiles_compile_for_sm90_without_spills(key: str, tmp_path: Path) -> None:
    problem = load_problem(DATA / key, {})
    recipe = {r.name: r for r in OfflineGenerator().recipes(problem.summary(), "cuda")}["graph/fused_coop"]
    assert (recipe.defaults["CM"], recipe.defaults["CN"]) == (8, 16)
    assert "KF_CONV_BOUNDS" in recipe.kernel and "__launch_bounds__(256, 1)" in recipe.kernel
    assert "shared_mem=" in recipe.forward  # the tiles' 49.7 KB, in dynamic shared memory
    report = nvcc_resources(recipe.kernel, recipe.defaults, tmp_path)
    fn = re.search(
        r"Function properties for (\w*convgemm\w*)\s*\n(.*?)\n.*?Used (\d+) registers", report, re.S
    )
    assert fn is not None, report
    assert "0 bytes spill stores, 0 bytes spill loads" in fn.group(2), report
    assert int(fn.group(3)) <= 255
