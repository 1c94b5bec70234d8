"""A sum (or mean) over the features of an affine map of a matrix product is lowered as a matrix-vector
product (:mod:`kfoundry.plugins.llms.offline.normalize_linear_sum`), and a column reduction of a row-major
buffer runs a thread per column (``lower_split._column_reduce``): checked on PoCL against float64 and,
for the CUDA text, on the CPU emulation.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from offline_helpers import run_against_float64

from kfoundry.core.problem import Problem, load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.normalize_linear_sum import REWRITE_NOTE, REWRITES
from kfoundry.runtime import load, synchronize

pytestmark = pytest.mark.usefixtures("pocl_runtime")


def _problem(tmp: Path, init: str, forward: str, inputs: str, init_inputs: str = "[]") -> Problem:
    src = f"""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                {init}

            def forward(self, x):
                {forward}

        def get_inputs():
            return {inputs}

        def get_init_inputs():
            return {init_inputs}
        """
    path = tmp / "problem.py"
    path.write_text(textwrap.dedent(src))
    return load_problem(path, {})


_LIN = "self.lin = nn.Linear(24, 300)"
_W = "self.w = nn.Parameter(torch.randn(300, 24)); self.p = nn.Parameter(torch.randn(300)); self.b = nn.Parameter(torch.randn(300))"

#: (init, forward): rewritten; 300 features, a batch of 37 rows (3-D: 37 x 1)
REWRITTEN = [
    (_LIN, "return torch.sum(self.lin(x), dim=1, keepdim=True)"),
    (_W, "y = torch.matmul(x, self.w.T) / 2\n                return torch.sum(y, dim=1, keepdim=True) * 1.5"),
    (_LIN, "return (self.lin(x) - self.lin.bias * 0.5).mean(dim=-1)"),
    (_W, "return torch.sum(3.0 - F.linear(x, self.w, self.b) * self.p, dim=1)"),
    (_W, "return (-(x @ self.w.t()) / self.p + 2.0).sum(-1, keepdim=True)"),
    (_LIN, "return torch.mean(self.lin(x.reshape(37, 1, 24)) + 1.0, dim=2)"),
]
#: (init, forward): not rewritten (the product is needed, the tail is not affine, or the sum is elsewhere)
KEPT = [
    (_LIN, "y = self.lin(x)\n                return torch.sum(y, dim=1, keepdim=True) + y"),
    (_LIN, "return torch.sum(torch.relu(self.lin(x)), dim=1)"),
    (_LIN, "return torch.sum(self.lin(x), dim=0)"),
    (_LIN, "y = self.lin(x)\n                return torch.sum(y * y[:, :1], dim=1)"),
    (_W, "return torch.sum(x @ self.w.T * x[:, :1], dim=1)"),
]


def _traced(problem: Problem) -> Any:
    return OfflineGenerator().spec(problem.summary()).graph


def _bound(expected: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """What an honest float32 computation may be off by: 64 ulps of the terms' magnitude."""
    return 64 * 2.0**-24 * scale + 1e-6


@pytest.mark.parametrize(("init", "forward"), REWRITTEN)
def test_affine_sums_of_a_product_become_a_matrix_vector_product(
    tmp_path: Path, init: str, forward: str
) -> None:
    problem = _problem(tmp_path, init, forward, "[torch.randn(37, 24)]")
    gm = _traced(problem)
    assert REWRITE_NOTE in gm.meta.get(REWRITES, [])
    assert not any(n.op == "call_module" for n in gm.graph.nodes)  # no Linear left
    spec = OfflineGenerator().spec(problem.summary())
    for name in ("graph/unfused", "graph/fused"):
        recipe = cookbook_graph.recipe(spec, "opencl", name, 1)
        assert REWRITE_NOTE in recipe.description
        got, expected = run_against_float64(problem, recipe)
        # every output sums 300 x 24 products of terms of size ~1
        err = (got - expected).abs()
        assert bool((err <= _bound(expected, torch.full_like(expected, 300 * 24.0))).all()), (name, err.max())


@pytest.mark.parametrize(("init", "forward"), KEPT)
def test_a_product_that_is_needed_or_not_summed_affinely_stays(
    tmp_path: Path, init: str, forward: str
) -> None:
    problem = _problem(tmp_path, init, forward, "[torch.randn(37, 24)]")
    gm = _traced(problem)
    assert REWRITES not in gm.meta
    assert any(
        n.op == "call_module" or getattr(n.target, "__name__", "") in ("matmul", "linear")
        for n in gm.graph.nodes
    )


def test_the_rewrite_reads_the_weight_on_every_call(tmp_path: Path) -> None:
    """A changed weight changes the output: the summed weight is not a constant of the build."""
    problem = _problem(
        tmp_path, _LIN, "return torch.sum(self.lin(x), dim=1, keepdim=True)", "[torch.randn(37, 24)]"
    )
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", "graph/fused", 1)
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    x = problem.make_inputs(1)[0]
    with torch.no_grad():
        before = model(x)
        synchronize()  # PoCL writes the host tensor asynchronously
        before = before.clone()
        for p in model.parameters():
            p.mul_(2.0)
        after = model(x)
        synchronize()
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-4)


#: column reductions: (forward, input shape) with few outputs and a long strided reduced dim
COLUMNS = [
    ("torch.sum(x * 2.0, dim=0)", (9000, 70)),
    ("torch.mean(x + 1.0, dim=1)", (3, 8500, 41)),
    ("torch.amax(x - 0.5, dim=0)", (8200, 33)),
    ("torch.amin(x * 3.0, dim=1, keepdim=True)", (2, 8195, 19)),
    ("torch.linalg.vector_norm(x + 0.0, ord=2, dim=0)", (8300, 17)),
    ("torch.linalg.vector_norm(x - 0.25, ord=1, dim=(0, 1))", (90, 100, 21)),
    ("torch.sum(x.t() * 2.0, dim=1)", (9000, 70)),  # a row sum of a transposed view: columns in memory
]


@pytest.mark.parametrize("forward", ["torch.sum(x * 2.0, dim=1)", "torch.sum(x.t().t() + 1.0, dim=1)"])
def test_a_row_sum_of_row_major_data_keeps_its_row_pieces(tmp_path: Path, forward: str) -> None:
    problem = _problem(tmp_path, "pass", f"return {forward}", "[torch.randn(70, 9000)]")
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", "graph/fused", 1)
    assert "cpart" not in recipe.kernel and "gpart" in recipe.kernel


@pytest.mark.parametrize(("forward", "shape"), COLUMNS)
def test_column_reductions_are_a_thread_per_column(
    tmp_path: Path, forward: str, shape: tuple[int, ...]
) -> None:
    problem = _problem(tmp_path, "pass", f"return {forward}", f"[torch.randn{shape!r}]")
    spec = OfflineGenerator().spec(problem.summary())
    for name in ("graph/unfused", "graph/fused"):
        recipe = cookbook_graph.recipe(spec, "opencl", name, 1)
        # (unfused, the transposed view's product is a contiguous buffer: a row sum there)
        assert ("cpart" in recipe.kernel) is (name == "graph/fused" or ".t()" not in forward), name
        got, expected = run_against_float64(problem, recipe)
        count = torch.tensor(shape).prod().item() / expected.numel()
        assert bool(
            ((got - expected).abs() <= _bound(expected, torch.full_like(expected, 4.0 * count))).all()
        )


def test_a_nan_reaches_its_column_and_no_other(tmp_path: Path) -> None:
    problem = _problem(tmp_path, "pass", "return torch.amax(x * 1.0, dim=0)", "[torch.randn(9000, 40)]")
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", "graph/fused", 1)
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    x = torch.randn(9000, 40)
    x[4321, 7] = float("nan")
    with torch.no_grad():
        got = namespace["ModelNew"]()(x)
        synchronize()
    expected = torch.amax(x, dim=0)
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert bool(got[7].isnan()) and not bool(got[torch.arange(40) != 7].isnan().any())


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_cuda_text_on_the_cpu_emulation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA recipe of a rewritten sum (a column sum of the weight, then a matrix-vector product)."""
    from test_offline_cuda_emulated import emu_load

    import kfoundry.runtime as runtime

    monkeypatch.setattr(runtime, "load", emu_load)
    problem = _problem(
        tmp_path,
        "self.lin = nn.Linear(24, 8300)",
        "return torch.sum(self.lin(x), dim=1, keepdim=True)",
        "[torch.randn(5, 24)]",
    )
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "cuda", "graph/fused_coop", 2)
    assert "cpart" in recipe.kernel
    got, expected = run_against_float64(problem, recipe)
    assert bool(((got - expected).abs() <= _bound(expected, torch.full_like(expected, 8300 * 24.0))).all())
