"""Softmax over a long dim that is not the innermost (:mod:`.lower_colsoftmax`): 32 columns x row slices per
work-group, each slice's (max, sum) merged through local memory. Run on PoCL (OpenCL, ``graph/fused``) and as
CUDA source on the CPU emulation of ``test_offline_cuda_emulated`` (``graph/fused_coop``), on columns built
to reach every merge case: slices whose rows are all -inf beside finite ones, a column of -inf, a +inf or a
NaN in one slice only, the max in one slice only; a column count off the 32-column work-group; softmax and
log-softmax, with an elementwise epilogue; and the shapes the schedule leaves to the thread per column."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import lower_colsoftmax
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {body}


def get_inputs():
    return [torch.randn(batch, rows, cols) * 3]


def get_init_inputs():
    return []


batch = 2
rows = 70
cols = 45
"""

BODIES = {
    "softmax": "torch.softmax(x, dim=1) * 2.0",
    "log_softmax": "torch.log_softmax(x * 1.5, dim=-2) - 1.0",
}


def _hostile(batch: int, rows: int, cols: int, slices: int) -> torch.Tensor:
    """Column 0-1 plain; 2: every slice but 3 all -inf; 3: all -inf; 4: one +inf; 5: one NaN; 6: the max
    in one slice (row 37), -inf elsewhere in that slice; 7: -inf at row 0 only; the rest plain."""
    torch.manual_seed(3)
    x = torch.randn(batch, rows, cols) * 3
    sl = torch.arange(rows) % slices
    x[:, sl != 3, 2] = -torch.inf
    x[:, :, 3] = -torch.inf
    x[1, 61, 4] = torch.inf
    x[0, 66, 5] = torch.nan
    x[:, 37, 6] = 50.0
    x[:, (sl == 37 % slices) & (torch.arange(rows) != 37), 6] = -torch.inf
    x[:, 0, 7] = -torch.inf
    return x


def _model(tmp_path: Path, name: str, lang: str, recipe_name: str) -> tuple[Any, Any, str]:
    path = tmp_path / f"{name}.py"
    path.write_text(PROBLEM.format(body=BODIES[name]))
    problem = load_problem(path, {})
    recipe = next(r for r in OfflineGenerator().recipes(problem.summary(), lang) if r.name == recipe_name)
    namespace: dict[str, Any] = {
        "PARAMS": dict(recipe.defaults),
        "__name__": "kf_candidate",
        "load": runtime.load,
    }
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own
    return namespace["ModelNew"](*problem.make_init_inputs()), problem, recipe.kernel


def _check(model: Any, problem: Any, lang: str) -> None:
    x = _hostile(2, 70, 45, lower_colsoftmax.COL_SLICES[lang])
    with torch.no_grad():
        got = model(x)
        runtime.synchronize()
        expected = problem.make_reference()(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.equal(got.isnan(), expected.isnan())


@pytest.fixture
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schedule at test sizes: columns of 16 rows or more, any column count."""
    monkeypatch.setattr(lower_colsoftmax, "MIN_ROWS", 16)
    monkeypatch.setattr(lower_colsoftmax, "MIN_COLUMNS", 1)


@pytest.mark.usefixtures("small_thresholds")
@pytest.mark.parametrize("name", sorted(BODIES))
def test_column_softmax_merges_like_torch_on_pocl(name: str, tmp_path: Path) -> None:
    pytest.importorskip("pyopencl")
    model, problem, kernel = _model(tmp_path, name, "opencl", "graph/fused")
    assert "softmax_cols(" in kernel
    _check(model, problem, "opencl")


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.usefixtures("small_thresholds")
@pytest.mark.parametrize("name", sorted(BODIES))
def test_column_softmax_merges_like_torch_on_the_cuda_emulation(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import test_offline_cuda_emulated as emu

    monkeypatch.setattr(runtime, "load", emu.emu_load)
    model, problem, kernel = _model(tmp_path, name, "cuda", "graph/fused_coop")
    assert "softmax_cols(" in kernel and "kf_smx" in kernel
    _check(model, problem, "cuda")


def test_short_columns_and_the_innermost_dim_keep_the_row_schedules(tmp_path: Path) -> None:
    """At the default thresholds a 70-row column keeps the thread per column; a softmax over the innermost
    dim is never this schedule."""
    path = tmp_path / "softmax.py"
    path.write_text(PROBLEM.format(body=BODIES["softmax"]))
    problem = load_problem(path, {})
    recipe = next(
        r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == "graph/fused_coop"
    )
    assert "softmax_cols(" not in recipe.kernel
    big = tmp_path / "rows.py"
    big.write_text(PROBLEM.format(body="torch.softmax(x, dim=-1)").replace("cols = 45", "cols = 4096"))
    problem = load_problem(big, {"rows": 8192})
    kernels = [r.kernel for r in OfflineGenerator().recipes(problem.summary(), "cuda")]
    assert kernels and not any("softmax_cols(" in k for k in kernels)
    assert lower_colsoftmax.applies_shape((64, 4096, 4095), 1)
