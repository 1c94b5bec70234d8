"""Cross-entropy rows in one read (a work-group per row, running max and rescaled sum), run on PoCL
against PyTorch: rows that are and are not multiples of four, ignored targets, mean / sum / none
reductions, a row with -inf logits, a row with a NaN, and large logits (no overflow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.runtime import load, synchronize

_SRC = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, t):
        return torch.nn.functional.cross_entropy(x, t, reduction="{reduction}", ignore_index={ign})

def get_inputs():
    return [torch.rand({rows}, {cols}), torch.randint(0, {cols}, ({rows},))]

def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


@pytest.mark.parametrize("schedule", ["graph/fused", "graph/unfused"])
@pytest.mark.parametrize(
    ("rows", "cols", "reduction"), [(33, 1000, "mean"), (17, 999, "sum"), (9, 2052, "none")]
)
def test_cross_entropy_matches_torch(
    tmp_path: Path, rows: int, cols: int, reduction: str, schedule: str
) -> None:
    path = tmp_path / "xent.py"
    path.write_text(_SRC.format(reduction=reduction, rows=rows, cols=cols, ign=3))
    problem = load_problem(path)
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", schedule, 1)
    if schedule == "graph/fused":
        assert "kf_s[BLOCK]" in recipe.kernel  # the one-read rows kernel
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    gen = torch.Generator().manual_seed(0)
    x = 8.0 * torch.randn(rows, cols, generator=gen)
    x[1] += 80.0  # large logits: exp would overflow without the max
    x[2, : cols // 2] = float("-inf")  # some -inf logits in a row
    t = torch.randint(0, cols, (rows,), generator=gen)
    t[0] = 3  # ignored
    t[2] = cols - 1
    with torch.no_grad():
        got = namespace["ModelNew"]()(x, t)
        synchronize()
    expected = torch.nn.functional.cross_entropy(x.double(), t, reduction=reduction, ignore_index=3)
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-4), (got, expected)
    if reduction == "none":  # a NaN logit makes its row's loss NaN
        x[4, 5] = float("nan")
        with torch.no_grad():
            got = namespace["ModelNew"]()(x, t)
            synchronize()
        assert torch.isnan(got[4]) and not torch.isnan(got[5])
