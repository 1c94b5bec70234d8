"""Scans of the offline lowering on PoCL against PyTorch: reverse scans (``flip(cumsum(flip(x)))``: the
outer flip applied on the scan's store, one kernel), flips the fusion must leave alone, scans over a dim
that is not innermost, ragged lengths, cumprod, exclusive and masked scans; every graph schedule (the
cooperative one with 32-item work-groups standing in for warps)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from kfoundry.core.problem import Problem, load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline import lower as lowering
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.runtime import load, synchronize

SCHEDULES = (pytest.param("graph/unfused", marks=pytest.mark.slow), "graph/fused", "graph/fused_coop")


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def problem_file(tmp: Path, forward: str, shape: tuple[int, ...], extra: str = "") -> Problem:
    """A KernelBench-style problem: ``forward(self, x)`` returning ``forward``, inputs of ``shape``."""
    src = f"""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x{", mask" if extra else ""}):
                return {forward}

        def get_inputs():
            return [torch.rand{shape!r}{extra}]

        def get_init_inputs():
            return []
        """
    path = tmp / "problem.py"
    path.write_text(textwrap.dedent(src))
    return load_problem(path, {})


def build(problem: Problem, name: str, monkeypatch: pytest.MonkeyPatch) -> Recipe:
    if name == "graph/fused_coop":
        monkeypatch.setattr(lowering, "LANE_MIN", 4)  # small shapes: take the loops across the lanes
    spec = OfflineGenerator().spec(problem.summary())
    return cookbook_graph.recipe(spec, "opencl", name, 1)


def run(problem: Problem, recipe: Recipe, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    ref = problem.make_reference()
    with torch.no_grad():
        expected = ref.double()(*[t.double() if t.is_floating_point() else t for t in inputs])
        got = model(*inputs)
        synchronize()
    assert got.shape == expected.shape
    return got.double(), expected


REVERSE = [
    # (forward, input shape, kernels expected with the fusion)
    ("torch.cumsum(x.flip(1), dim=1).flip(1)", (5, 301), 1),  # ragged: 301 is no multiple of 32 or 128
    ("torch.cumsum(x.flip(0), dim=0).flip(0)", (37, 6), 1),  # the scanned dim is not innermost
    ("torch.cumsum(x.flip(-1), dim=-1).flip(-1) * 2.0 + 1.0", (4, 130), 1),  # an epilogue after the flip
    ("torch.cumprod(x.flip(1) + 0.5, dim=1).flip(1)", (3, 40), 1),
    ("torch.cumsum(x, dim=1).flip(1)", (4, 77), 1),  # a forward scan read backwards
    ("torch.cumsum(x.flip(1), dim=1).flip(0)", (6, 50), 2),  # another dim: not fused
    ("torch.cumsum(x.flip(1), dim=1).flip((0, 1))", (6, 50), 2),  # two dims: not fused
    ("torch.cumsum(x, dim=1)", (3, 200), 1),
    ("torch.cumprod(1.0 + 0.01 * x, dim=1)", (2, 256), 1),  # whole steps of 128 only
    ("torch.cumsum(x * mask, dim=1)", (4, 333), 1),
    ("torch.cumsum(torch.cat((torch.zeros_like(x[:, :1]), x), dim=1)[:-1], dim=1)", (5, 129), 1),
]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize(("forward", "shape", "kernels"), REVERSE)
def test_scans_match_torch(
    forward: str,
    shape: tuple[int, ...],
    kernels: int,
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    masked = "mask" in forward
    extra = f", torch.randint(0, 2, {shape!r}).bool()" if masked else ""
    problem = problem_file(tmp_path, forward, shape, extra)
    recipe = build(problem, name, monkeypatch)
    if name != "graph/unfused":
        assert recipe.kernel.count("KF_KERNEL k") == kernels, recipe.kernel
    if name == "graph/fused_coop":
        assert "kf_wscan_" in recipe.kernel
    torch.manual_seed(0)
    inputs = [torch.rand(shape)] + ([torch.randint(0, 2, shape).bool()] if masked else [])
    got, expected = run(problem, recipe, inputs)
    err = ((got - expected).abs() / (expected.abs() + 1e-2)).max().item()
    assert err < 1e-4, f"{forward} {name}: max relative error {err}"
