"""A convolution feeding a global reduction or pooling (adaptive average pooling to one cell, a mean
over the spatial dims, pooling then a mean), lowered by the offline generator and run on PoCL.

The convolution is the tiled implicit-GEMM kernel (``convgemm``) writing its output once; the
reduction is a separate pass over it: at small shapes a plain one, where a plane holds at least
``SPLIT_MIN`` terms the blocked/split reduction (many work-groups per plane), never a work item that
folds a whole plane serially (the old ``adaptiveavg`` kernel of a one-cell adaptive pool). The CUDA
source of the same lowering is compiled for sm_90 where nvcc is installed.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from offline_helpers import nvcc_resources, run_against_eager

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph, lower_conv, lower_conv_pool, lower_ops
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())

CHAINS = [
    "level2/conv2d_gap_view_linear.py",
    "level2/conv2d_gelu_global_avgpool.py",
    "level2/conv2d_layer_norm_gelu.py",
    "level2/conv_transpose2d_gap_bias_logsumexp_sum_multiply.py",
    "level2/conv_transpose2d_maxpool_hardtanh_mean_tanh.py",
]

#: the chains whose spatial mean (or one-cell pool) consumes the conv (after its elementwise epilogue)
FOLDED = {
    "level2/conv2d_gap_view_linear.py",
    "level2/conv2d_gelu_global_avgpool.py",
    "level2/conv_transpose2d_gap_bias_logsumexp_sum_multiply.py",
}

#: planes of 94 x 94 conv outputs: above SPLIT_MIN terms, so the blocked/split reduction serves them
MID = {"batch_size": 2, "in_channels": 3, "out_channels": 8, "height": 96, "width": 96}


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def _kernels(source: str) -> list[str]:
    """The generated kernels' names, in launch order."""
    return re.findall(
        r"KF_KERNEL\s+(?:__\w+__\([^)]*\)\s+|KF_\w*BOUNDS\s+)*(?:void\s+)?(\w+)\(", source
    ) or re.findall(r"__kernel\s+void\s+(\w+)\(", source)


def _run(
    key: str, shape: dict[str, int], monkeypatch: pytest.MonkeyPatch, fold: bool, name: str = "graph/fused"
) -> tuple[str, float, float]:
    monkeypatch.setattr(lower_conv, "MIN_ROWS", 1)  # small shapes: every convolution as a GEMM
    monkeypatch.setattr(lower_conv_pool, "MIN_POSITIONS", 1 if fold else 1 << 40)
    problem = load_problem(DATA / key, shape)
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", name, 1)
    got, expected = run_against_eager(problem, recipe)
    return recipe.kernel, (got - expected).abs().max().item(), expected.abs().max().item()


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("key", CHAINS)
def test_conv_then_global_reduction_matches_eager_on_pocl(
    key: str, fold: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel, err, scale = _run(key, SMALL.get(key, {}), monkeypatch, fold)
    names = _kernels(kernel)
    assert names and "convgemm" in names[0], names
    assert not any("adaptiveavg" in n for n in names), names
    # folded: the conv kernel sums its tiles per (image, channel) where the spatial mean is its consumer
    assert ("psum" in kernel) == (fold and key in FOLDED), names
    assert err <= 1e-4 * max(1.0, scale), f"{key}: max error {err}"


@pytest.mark.parametrize("key", ["level2/conv2d_gap_view_linear.py", "level2/conv2d_gelu_global_avgpool.py"])
def test_one_cell_adaptive_pool_is_a_many_work_group_reduction(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert lower_ops.SPLIT_MIN <= 94 * 94
    kernel, err, scale = _run(key, MID, monkeypatch, fold=False)
    names = _kernels(kernel)
    # the conv alone in the tiled kernel; the pooling a pass of pieces per plane, then their combination
    assert "convgemm" in names[0] and sum("convgemm" in n for n in names) == 1, names
    assert any("piece" in n or "part" in n for n in names[1:]), names
    assert not any("adaptiveavg" in n for n in names), names
    assert err <= 1e-4 * max(1.0, scale), f"{key}: max error {err}"


@pytest.mark.parametrize("name", ["graph/fused", "graph/fused_coop"])
@pytest.mark.parametrize("key", sorted(FOLDED))
def test_spatial_mean_folds_into_the_conv_epilogue(
    key: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel, err, scale = _run(key, MID, monkeypatch, True, name)
    names = _kernels(kernel)
    # cooperative: a warp per (image, channel) folds its partials, laid out contiguously for it
    assert ("kf_lane" in kernel) == (name == "graph/fused_coop"), names
    # the conv output is never stored: the conv kernel writes a partial per (tile, image, channel), one
    # small kernel folds them (no per-plane pieces: the planes' terms are already summed)
    assert "psum" in kernel and "convgemm" in names[0], names
    assert not any("piece" in n or "part" in n for n in names), names
    assert err <= 1e-4 * max(1.0, scale), f"{key}: max error {err}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("key", sorted(FOLDED))
def test_conv_reduce_cuda_compiles_for_sm90(key: str, tmp_path: Path) -> None:
    problem = load_problem(DATA / key, {})
    for recipe in OfflineGenerator().recipes(problem.summary(), "cuda"):
        names = _kernels(recipe.kernel)
        assert not any("adaptiveavg" in n for n in names), (recipe.name, names)
        if recipe.name == "graph/unfused":
            continue
        assert "convgemm" in names[0] and "psum" in recipe.kernel, (recipe.name, names)
        nvcc_resources(recipe.kernel, recipe.defaults, tmp_path)


_MODEL = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = {conv}

    def forward(self, x):
        y = self.conv(x)
        return {out}


def get_inputs():
    return [torch.rand({shape})]


def get_init_inputs():
    return []
"""

#: (conv, the reduction of its output y, input shape, whether the conv epilogue folds it)
FORMS = [
    (
        "nn.ConvTranspose2d(6, 8, 3, stride=2, padding=1, output_padding=1)",
        "torch.relu(y).mean(dim=[-1, -2])",
        "2, 6, 17, 15",
        True,
    ),
    ("nn.Conv2d(8, 16, 3, groups=2)", "y.sum(dim=(2, 3), keepdim=True) * 0.5", "2, 8, 20, 17", True),
    ("nn.Conv1d(4, 8, 5)", "torch.nn.functional.adaptive_avg_pool1d(y, 1)", "3, 4, 300", True),
    ("nn.Conv3d(3, 8, 3)", "y.mean(dim=(2, 3, 4))", "2, 3, 6, 7, 8", True),
    ("nn.Conv2d(3, 8, 3)", "y.mean(dim=3)", "2, 3, 20, 20", False),
    ("nn.Conv2d(3, 8, 3)", "y.mean(dim=(2, 3), keepdim=True) + y", "2, 3, 20, 20", False),
]


@pytest.mark.parametrize(("conv", "out", "shape", "folds"), FORMS)
def test_fold_forms_match_eager_on_pocl(
    conv: str, out: str, shape: str, folds: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transposed strided, grouped, 1-D and 3-D convs folded; a partial-spatial mean or a conv output
    with another consumer keeps the stored output."""
    path = tmp_path / "chain.py"
    path.write_text(_MODEL.format(conv=conv, out=out, shape=shape))
    monkeypatch.setattr(lower_conv, "MIN_ROWS", 1)
    monkeypatch.setattr(lower_conv_pool, "MIN_POSITIONS", 1)
    problem = load_problem(path, {})
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", "graph/fused", 1)
    got, expected = run_against_eager(problem, recipe)
    assert ("psum" in recipe.kernel) == folds, _kernels(recipe.kernel)
    assert (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())
