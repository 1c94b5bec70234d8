"""kl_div(log(p), t) as t * log(t / p) (one logarithm) where t / p is a normal float, else torch's
log t - log p: PoCL against PyTorch on ordinary probabilities and on the edges (p = 0, p < 0, tiny and
huge ratios, inf, NaN, t = 0, t < 0; not t = inf, where torch's
t log t - t log p is NaN and this lowering, before and after, inf), element by element (reduction 'none') and as the batch mean."""

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
    def forward(self, p, t):
        return torch.nn.functional.kl_div(torch.log(p), t, reduction="{reduction}")

def get_inputs():
    return [torch.rand({rows}, {cols}).softmax(dim=-1), torch.rand({rows}, {cols}).softmax(dim=-1)]

def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def _run(tmp_path: Path, reduction: str, p: torch.Tensor, t: torch.Tensor, schedule: str) -> torch.Tensor:
    path = tmp_path / "kl.py"
    path.write_text(_SRC.format(reduction=reduction, rows=p.shape[0], cols=p.shape[1]))
    problem = load_problem(path)
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", schedule, 1)
    # the one-logarithm form where log(p) is fused into the loss (unfused: log(p) is a buffer)
    assert ("1.17549435e-38f" in recipe.kernel) == (schedule != "graph/unfused")
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    with torch.no_grad():
        got = namespace["ModelNew"]()(p, t)
        synchronize()
    return got


@pytest.mark.parametrize("schedule", ["graph/fused", "graph/unfused"])
def test_kl_edges_elementwise(tmp_path: Path, schedule: str) -> None:
    p = torch.tensor([[0.5, 0.0, -0.25, 1e-30, 1e30, float("inf"), float("nan"), 0.3, 0.3, 1e-38, 0.7]])
    t = torch.tensor([[0.25, 0.5, 0.5, 1e30, 1e-30, 0.5, 0.5, 0.0, -0.1, 1.0, 0.7]])
    got = _run(tmp_path, "none", p, t, schedule)
    expected = torch.nn.functional.kl_div(torch.log(p), t, reduction="none")
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True), (got, expected)


@pytest.mark.parametrize("schedule", ["graph/fused", "graph/unfused"])
def test_kl_batchmean(tmp_path: Path, schedule: str) -> None:
    gen = torch.Generator().manual_seed(0)
    p = (torch.rand(37, 3000, generator=gen) * 3).softmax(dim=-1)
    t = torch.rand(37, 3000, generator=gen).softmax(dim=-1)
    got = _run(tmp_path, "batchmean", p, t, schedule)
    expected = torch.nn.functional.kl_div(torch.log(p.double()), t.double(), reduction="batchmean")
    assert abs(got.double().item() - expected.item()) <= 1e-5 * abs(expected.item()) + 1e-7
