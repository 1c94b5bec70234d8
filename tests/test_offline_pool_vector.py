"""The pooling kernels' vector path (``lower_pool._vectorised``): inputs whose rows are whole float4s.

Each case's last input dim is a multiple of 4, so the specialised kernel takes the float4 path (an
item of ``R`` rows x 4 adjacent output columns, aligned chunks masked per row and chunk); the scalar
specialised path and the generic one are made to write a sentinel, so a wrong or a skipped vector path
fails. Cases cover borders, padding, dilation, ceil mode, count_include_pad, divisor_override, ragged
output rows (and ones a multiple of 4 long: float4 stores), NaN inputs and 1-D to 3-D. Run on PoCL
against eager PyTorch; the real-size CUDA kernels are compiled with nvcc for sm_90 without spills.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from tests.offline_helpers import nvcc_resources, run_against_eager, slow_volumes

_GEN = OfflineGenerator()
DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
#: the scalar paths' stores (specialised and generic); the vector path stores ``accN_s`` or float4s
_SCALAR_STORE = re.compile(r"(y\[[^\]]*\]) = acc;")


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def _problem(tmp: Path, layer: str, shape: tuple[int, ...], nan: bool) -> Any:
    fill = "    x.view(-1)[::7] = float('nan')\n" if nan else ""
    src = (
        "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"        self.pool = {layer}\n\n"
        "    def forward(self, x):\n"
        "        return self.pool(x)\n\n\n"
        "def get_inputs():\n"
        f"    x = torch.randn{shape}\n{fill}"
        "    return [x]\n\n\n"
        "def get_init_inputs():\n"
        "    return []\n"
    )
    path = tmp / "pool_vec_case.py"
    path.write_text(src)
    return load_problem(path, {})


CASES = [
    ("nn.MaxPool1d(8, stride=1, padding=4, dilation=3)", (2, 3, 36)),
    ("nn.MaxPool1d(3, stride=2, padding=1, ceil_mode=True)", (2, 3, 28)),
    ("nn.AvgPool1d(8, stride=1, padding=4)", (2, 3, 44)),
    ("nn.AvgPool1d(5, stride=3, padding=2, ceil_mode=True, count_include_pad=False)", (3, 2, 32)),
    ("nn.MaxPool2d(4, stride=1, padding=1)", (2, 3, 13, 20)),
    ("nn.MaxPool2d(2, stride=2, padding=1, dilation=3)", (2, 2, 11, 16)),
    ("nn.MaxPool2d(2, stride=2)", (2, 2, 10, 16)),
    ("nn.MaxPool2d((3, 2), stride=(2, 1), padding=(1, 0), ceil_mode=True)", (2, 2, 14, 12)),
    ("nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)", (2, 3, 17, 12)),
    ("nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)", (1, 3, 15, 8)),
    ("nn.AvgPool2d(4, stride=3, padding=2, divisor_override=5)", (2, 2, 16, 20)),
    ("nn.AvgPool2d(2, ceil_mode=True)", (2, 2, 9, 12)),
    ("nn.MaxPool3d(3, stride=2, padding=1, ceil_mode=True)", (1, 2, 9, 10, 12)),
    ("nn.MaxPool3d((2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), dilation=(2, 1, 2))", (1, 2, 8, 9, 12)),
    ("nn.AvgPool3d(3, stride=2, padding=1)", (2, 2, 9, 8, 16)),
    ("nn.AvgPool3d(2, stride=1, padding=1, ceil_mode=True, count_include_pad=False)", (1, 2, 5, 6, 8)),
    # rows that are not whole float4s: the shifted path (chunks aligned in memory, rows shifted out)
    ("nn.MaxPool1d(8, stride=1, padding=4, dilation=3)", (2, 3, 37)),
    ("nn.AvgPool1d(5, stride=3, padding=2, ceil_mode=True, count_include_pad=False)", (3, 2, 29)),
    ("nn.MaxPool2d(4, stride=1, padding=1)", (2, 3, 13, 21)),
    ("nn.MaxPool2d(2, stride=2, padding=1, dilation=3)", (2, 2, 11, 18)),
    ("nn.MaxPool2d(2, stride=2, ceil_mode=True)", (2, 2, 9, 11)),
    ("nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)", (2, 3, 17, 13)),
    ("nn.MaxPool3d(3, stride=2, padding=1, ceil_mode=True)", (1, 2, 9, 10, 11)),
    ("nn.AvgPool3d(3, stride=2, padding=1)", (2, 2, 9, 8, 13)),
    ("nn.AvgPool3d(3, stride=2, padding=1, count_include_pad=False)", (1, 3, 7, 6, 15)),
]


@pytest.mark.parametrize(("layer", "shape"), slow_volumes(CASES))
def test_vector_path_matches_eager(tmp_path: Path, layer: str, shape: tuple[int, ...]) -> None:
    problem = _problem(tmp_path, layer, shape, nan=layer.startswith("nn.Max"))
    recipes = [r for r in _GEN.recipes(problem.summary(), "opencl") if r.name.startswith("graph/")]
    assert recipes
    for recipe in recipes:
        assert "KF_PLD4" in recipe.kernel, f"{recipe.name}: no vector path"
        if shape[-1] % 4:
            assert "_sh & 2" in recipe.kernel, f"{recipe.name}: no shifted path"
        kernel, stores = _SCALAR_STORE.subn(r"\1 = 12345.0f;", recipe.kernel)
        assert stores >= 2, recipe.name  # the scalar specialised and the generic paths
        got, expected = run_against_eager(problem, replace(recipe, kernel=kernel))
        assert torch.equal(got.isnan(), expected.isnan()), f"{layer} {recipe.name}: NaN positions differ"
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True), (
            f"{layer} {recipe.name}: max error {(got - expected).nan_to_num().abs().max().item()}"
        )


def test_misaligned_buffer_takes_the_scalar_path(tmp_path: Path) -> None:
    """A buffer not 16-byte aligned (forced: the flag that forward computes set to 0) takes the scalar
    specialised path; the vector paths' results are poisoned, so taking either fails."""
    problem = _problem(tmp_path, "nn.MaxPool2d(4, stride=1, padding=1)", (2, 3, 13, 21), nan=True)
    recipe = next(r for r in _GEN.recipes(problem.summary(), "opencl") if r.name == "graph/fused")
    kernel = re.sub(r"(\w+_s); \{ float acc = \w+;", r"\1; { float acc = 12345.0f;", recipe.kernel)
    forward, flags = re.subn(r"(X\d+) = 0 if .*", r"\1 = 0", recipe.forward)
    assert kernel != recipe.kernel and flags == 1
    got, expected = run_against_eager(problem, replace(recipe, kernel=kernel, forward=forward))
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True)


VEC_ROWS = sorted(f"level1/{p.name}" for p in (DATA / "level1").glob("*pool*d.py"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize(
    "key", [k if "3d" not in k else pytest.param(k, marks=pytest.mark.slow) for k in VEC_ROWS]
)
def test_real_size_vector_kernels_build_without_spills(key: str, tmp_path: Path) -> None:
    """The KernelBench level-1 pooling rows (every one has a vector path, taken where its rows allow):
    every graph recipe builds for sm_90 with no spills and no local-memory stack."""
    problem = load_problem(DATA / key, {})
    recipes = [r for r in _GEN.recipes(problem.summary(), "cuda") if r.name.startswith("graph/")]
    assert recipes
    for recipe in recipes:
        assert "KF_PLD4" in recipe.kernel, f"{key} {recipe.name}"
        defines = {k: v for k, v in recipe.defaults.items() if isinstance(v, int)}
        report = nvcc_resources(recipe.kernel, defines, tmp_path)
        assert "0 bytes spill stores" in report and "0 bytes stack frame" in report, report
