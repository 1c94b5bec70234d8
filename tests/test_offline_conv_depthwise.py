"""The offline generator's depthwise convolution stencil (``lower_conv.emit_conv_depthwise``) on PoCL.

Each case writes a small KernelBench-format problem (a depthwise 2-D convolution, optionally followed by
a pointwise one and an elementwise tail), renders its fused graph recipe, runs the real OpenCL kernels
and compares with eager PyTorch: ragged sizes (the strip's last rows and the tile's last columns),
stride, padding, dilation, asymmetric windows, channel multipliers, bias, epilogues, and the generic
(runtime-window) path when the module's geometry changes after generation.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.runtime import load, synchronize

_SRC = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d({c}, {c} * {mult}, {k}, stride={s}, padding={p}, dilation={d}, groups={c}, bias={bias})
        self.pw = nn.Conv2d({c} * {mult}, 8, 1, bias=False)

    def forward(self, x):
        y = self.dw(x)
        {tail}


def get_inputs():
    return [torch.rand({n}, {c}, {h}, {w}) - 0.5]


def get_init_inputs():
    return []
"""

_SLOW = pytest.mark.slow
CASES = [
    # (channels, multiplier, kernel, stride, padding, dilation, bias, n, h, w, tail)
    (3, 1, 3, 1, 1, 1, False, 2, 19, 37, "return self.pw(y)"),  # depthwise separable, ragged
    pytest.param((4, 1, 3, 1, 0, 1, False, 1, 13, 35, "return torch.sigmoid(y)"), marks=_SLOW),  # no padding
    (2, 2, (3, 5), (2, 1), (1, 2), (2, 1), True, 2, 17, 23, "return torch.tanh(y) * 2.0 + 1.0"),
    pytest.param((5, 1, 5, 2, 2, 1, True, 1, 21, 40, "return torch.relu(y)"), marks=_SLOW),
    pytest.param((3, 3, (1, 3), 1, (0, 1), (1, 2), False, 1, 9, 33, "return self.pw(y)"), marks=_SLOW),
]


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def _problem(tmp_path: Path, case: tuple) -> Path:
    c, mult, k, s, p, d, bias, n, h, w, tail = case
    src = _SRC.format(c=c, mult=mult, k=k, s=s, p=p, d=d, bias=bias, n=n, h=h, w=w, tail=tail)
    path = tmp_path / "dw_problem.py"
    path.write_text(src)
    return path


def _model_and_inputs(path: Path, name: str) -> tuple[str, torch.nn.Module, torch.nn.Module, list]:
    problem = load_problem(path, {})
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", name, 1)
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    ref = problem.make_reference()
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    return recipe.kernel, ref, model, problem.make_inputs(1)


@pytest.mark.parametrize("case", CASES)
def test_depthwise_stencil_matches_eager_on_pocl(tmp_path: Path, case: tuple) -> None:
    kernel, ref, model, inputs = _model_and_inputs(_problem(tmp_path, case), "graph/fused")
    assert "_dwconv(" in kernel
    with torch.no_grad():
        expected = ref(*inputs)
        got = model(*inputs)
        synchronize()
    assert got.shape == expected.shape
    err = (got - expected).abs().max().item()
    assert err <= 1e-4 * max(1.0, expected.abs().max().item()), f"{case}: max error {err}"


def test_depthwise_stencil_generic_path_when_geometry_changes(tmp_path: Path) -> None:
    """The unrolled window is the module's at generation time; a changed stride/dilation runs the loops."""
    case = (3, 1, 3, 1, 1, 1, True, 2, 18, 35, "return torch.relu(y)")
    _, ref, model, inputs = _model_and_inputs(_problem(tmp_path, case), "graph/fused")
    for m in (ref, model):
        dw = m.dw if hasattr(m, "dw") else m.m0.dw
        dw.stride, dw.dilation = (2, 1), (1, 2)
    with torch.no_grad():
        expected = ref(*inputs)
        got = model(*inputs)
        synchronize()
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(
    ("case", "params"),
    [
        ((3, 1, 3, 1, 1, 1, False, 2, 19, 37, "return self.pw(y)"), {"CM": 8, "CN": 4}),
        ((2, 2, (3, 5), (2, 1), (1, 2), (2, 1), True, 1, 17, 23, "return torch.tanh(y) * 2.0"), {}),
    ],
)
def test_depthwise_stencil_cuda_on_the_cpu_emulation(
    tmp_path: Path, case: tuple, params: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA text of the stencil (and of a following 128 x 64-tile pointwise GEMM) run on the
    emulation of ``tests/test_offline_cuda_emulated.py``."""
    from tests.test_offline_cuda_emulated import emu_load

    monkeypatch.setattr(runtime, "load", emu_load)
    problem = load_problem(_problem(tmp_path, case), {})
    recipe = next(r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == "graph/fused")
    assert "_dwconv(" in recipe.kernel
    torch.manual_seed(0)
    ref = problem.make_reference()
    inputs = problem.make_inputs(1)
    namespace: dict[str, Any] = {"PARAMS": {**recipe.defaults, **params}, "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        expected = ref(*inputs)
        got = model(*inputs)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("stride", "padding", "rows"), [(1, 0, 8), (2, 1, 2), (1, 2, 4)])
def test_column_strip_recipe_matches_eager_on_pocl(
    tmp_path: Path, stride: int, padding: int, rows: int
) -> None:
    """The whole-problem ``depthwise_conv2d/column_strip`` recipe: ragged planes (the strip's last rows,
    the last work-group's columns), stride, padding, bias."""
    src = f"""import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv2d = nn.Conv2d(3, 3, 3, stride={stride}, padding={padding}, groups=3, bias=True)

    def forward(self, x):
        return self.conv2d(x)


def get_inputs():
    return [torch.rand(2, 3, 21, 37) - 0.5]


def get_init_inputs():
    return []
"""
    path = tmp_path / "dw_only.py"
    path.write_text(src)
    problem = load_problem(path, {})
    recipe = next(
        r
        for r in OfflineGenerator().recipes(problem.summary(), "opencl")
        if r.name == "depthwise_conv2d/column_strip"
    )
    namespace = {
        "PARAMS": {**recipe.defaults, "ROWS": rows, "BLOCK_X": 16, "BLOCK_Y": 2},
        "__name__": "kf_candidate",
    }
    namespace["load"] = load
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    ref = problem.make_reference()
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = ref(*inputs)
        got = model(*inputs)
        synchronize()
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
