"""The offline generator's implicit-GEMM convolution (``lower_conv``), run on PoCL at small shapes.

Each case renders the fused graph recipe (the implicit GEMM) of one of our KernelBench-format problems,
runs its real OpenCL kernels through the runtime and compares with eager PyTorch: plain, 1-D and 3-D,
strided, padded and dilated, grouped, transposed (strided, dilated, grouped, output padding) and
Level-2 chains whose elementwise tail is applied on store; each at more than one register block.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from offline_helpers import run_against_eager

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph, lower_conv
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())

_SLOW = pytest.mark.slow
CASES = [
    ("level1/conv2d_square.py", (1, 2)),
    pytest.param("level1/conv2d_dilated_padded.py", (2, 4), marks=_SLOW),
    ("level1/conv2d_grouped.py", (1, 8)),
    pytest.param("level1/conv1d.py", (2, 4), marks=_SLOW),
    ("level1/conv1d.py", (8, 4)),
    ("level1/conv2d_asymmetric_strided.py", (8, 4)),
    ("level1/conv_transpose1d.py", (8, 4)),
    pytest.param("level2/conv1d_batchnorm_relu_maxpool.py", (8, 4), marks=_SLOW),
    pytest.param("level1/conv3d.py", (1, 4), marks=_SLOW),
    ("level1/conv_transpose2d.py", (1, 2)),
    ("level1/conv_transpose2d_strided_dilated.py", (2, 8)),
    pytest.param("level1/conv_transpose3d.py", (1, 4), marks=_SLOW),
    ("level2/conv2d_tanh_scaling_bias_maxpool.py", (4, 4)),
    ("level2/conv_transpose2d_maxpool_hardtanh_mean_tanh.py", (4, 8)),
    pytest.param("level2/conv_transpose2d_bias_clamp_scaling_clamp_divide.py", (1, 8), marks=_SLOW),
]


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def _run(key: str, block: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> tuple[str, float, float]:
    monkeypatch.setattr(lower_conv, "MIN_ROWS", 1)  # small shapes: every convolution as a GEMM
    problem = load_problem(DATA / key, SMALL.get(key, {}))
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", "graph/fused", 1)
    got, expected = run_against_eager(problem, recipe, {**recipe.defaults, "CM": block[0], "CN": block[1]})
    return recipe.kernel, (got - expected).abs().max().item(), expected.abs().max().item()


@pytest.mark.parametrize(("key", "block"), CASES)
def test_implicit_gemm_conv_matches_eager_on_pocl(
    key: str, block: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel, err, scale = _run(key, block, monkeypatch)
    assert "convgemm" in kernel
    assert err <= 1e-4 * max(1.0, scale), f"{key} at CM, CN = {block}: max error {err}"


def test_depthwise_conv_is_a_stencil_and_tiles_follow_the_shape() -> None:
    gen = OfflineGenerator()
    separable = load_problem(DATA / "level1/depthwise_separable_conv.py", {})  # depthwise, then pointwise
    fused = {r.name: r for r in gen.recipes(separable.summary(), "cuda")}["graph/fused"]
    assert "_dwconv(" in fused.kernel and "_convgemm(" in fused.kernel
    square = load_problem(DATA / "level1/conv2d_square.py", {})  # 128 output channels: 128 x 256 tiles
    coop = {r.name: r for r in gen.recipes(square.summary(), "cuda")}["graph/fused_coop"]
    assert "convgemm" in coop.kernel and coop.defaults["CM"] == 8 and coop.defaults["CN"] == 16
    dilated = load_problem(DATA / "level1/conv2d_dilated_padded.py", {})  # 64 output channels: 64 x 128
    fused = {r.name: r for r in gen.recipes(dilated.summary(), "cuda")}["graph/fused"]
    assert fused.defaults["CM"] == 4 and fused.defaults["CN"] == 8
    convt = load_problem(DATA / "level2/conv_transpose2d_softmax_sigmoid.py", {})  # 128 rows, transposed 2-D
    fused = {r.name: r for r in gen.recipes(convt.summary(), "cuda")}["graph/fused"]
    # 128 x 256 tiles (one block per SM anyway, no spills); 128 x 64 ones would take 130 registers there
    assert (fused.defaults["CM"], fused.defaults["CN"]) == (8, 16)
    assert lower_conv.conv_blocks([(32, 262144, 64)]) == (2, 8)
    assert lower_conv.conv_blocks([(128, 64, 1)]) == (4, 2)  # too few 128-row tiles: narrower ones
