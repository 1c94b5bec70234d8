"""The graph's warp-per-row softmax (``graph/fused_coop``): each lane's running (max, sum) in one read of
the row, merged across the warp. Run as CUDA source on the CPU emulation of ``test_offline_cuda_emulated``
(g++ C++20), on rows built to reach every merge case: lanes whose terms are all -inf beside finite ones, a
row of -inf, a +inf or a NaN in one lane only, a max that only one lane holds, and rows shorter than the
warp; softmax and log-softmax, as a problem's middle step and as its output."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import test_offline_cuda_emulated as emu
import torch

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import lower as lowering
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
    return [torch.randn(rows, cols) * 3]


def get_init_inputs():
    return []


rows = 12
cols = 200
"""

BODIES = {
    "softmax": "torch.softmax(x * 1.5, dim=-1) * 2.0",
    "log_softmax": "torch.log_softmax(x, dim=1) - 1.0",
}


def _hostile(rows: int, cols: int) -> torch.Tensor:
    """Rows 0-1 plain; 2: every lane but 3 all -inf; 3: all -inf; 4: one +inf; 5: one NaN; 6: the max
    in one lane (index 37 mod cols), -inf elsewhere in that lane; 7: -inf at lane 0 only; rest plain."""
    torch.manual_seed(3)
    x = torch.randn(rows, cols) * 3
    lane = torch.arange(cols) % 32
    x[2, lane != 3] = -torch.inf
    x[3] = -torch.inf
    x[4, 101 % cols] = torch.inf
    x[5, 66 % cols] = torch.nan
    top = 37 % cols
    x[6, top] = 50.0
    x[6, (lane == top % 32) & (torch.arange(cols) != top)] = -torch.inf
    x[7, 0] = -torch.inf
    return x


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("cols", [200, 20])
@pytest.mark.parametrize("name", sorted(BODIES))
def test_lane_softmax_merges_like_torch(
    name: str, cols: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "load", emu.emu_load)
    monkeypatch.setattr(lowering, "LANE_MIN", 4)  # a warp per row at these sizes
    path = tmp_path / f"{name}.py"
    path.write_text(PROBLEM.format(body=BODIES[name]))
    problem = load_problem(path, {"cols": cols})
    recipe = next(
        r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == "graph/fused_coop"
    )
    assert "kf_wmax(mx)" in recipe.kernel and "kf_wsum(den)" in recipe.kernel  # the lanes' merge
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own
    model = namespace["ModelNew"](*problem.make_init_inputs())
    x = _hostile(12, cols)
    with torch.no_grad():
        got = model(x)
        expected = problem.make_reference()(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.equal(got.isnan(), expected.isnan())
