"""Reductions and row ops over a dimension that is not the input's innermost (a strided one), on PoCL
against PyTorch in float64: with many outputs the cooperative schedule gives each output a thread (its
neighbours on the neighbouring, contiguous columns: coalesced), not a warp whose lanes would stride the
reduced dim; the loops keep four loads in flight (a ragged remainder after them), softmax reads its row
twice (an online max and sum, then the write). NaN and infinities as torch; the warp-per-output form stays
for reductions over the innermost dim.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from eval_helpers import fast_config

from kfoundry.core.evaluation import Evaluator
from kfoundry.core.models import Outcome
from kfoundry.core.plugins import get_plugin
from kfoundry.core.problem import Problem, load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline import lower as lowering
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.runtime import load, set_backend, synchronize
from tests.offline_helpers import graph_problem_path

SCHEDULES = ("graph/fused", "graph/fused_coop")

#: (forward over the middle dim of the input, whether its result is an index)
FORWARDS = [
    ("torch.prod(x.abs(), dim=1)", False),
    ("torch.argmin(x, dim=1)", True),
    ("torch.argmax(x, dim=1)", True),
    ("torch.softmax(x, dim=1)", False),
    ("torch.log_softmax(x, dim=1)", False),
    # (an elementwise op with it: a plain sum / amax / prod is the reduce family's, not the graph's)
    ("torch.sum(x * 2.0, dim=1)", False),
    ("torch.amax(x, dim=1) + 1.0", False),
    ("torch.cumsum(x, dim=1)", False),
]


def problem_file(tmp: Path, forward: str, shape: tuple[int, ...]) -> Problem:
    """A KernelBench-style problem: ``forward(self, x)`` returning ``forward``, an input of ``shape``."""
    src = f"""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return {forward}

        def get_inputs():
            return [torch.rand{shape!r}]

        def get_init_inputs():
            return []
        """
    path = tmp / "problem.py"
    path.write_text(textwrap.dedent(src))
    return load_problem(path, {})


def build(problem: Problem, name: str, lang: str = "opencl") -> Recipe:
    return cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), lang, name, 1)


@pytest.fixture
def _pocl() -> None:
    backend = get_plugin("backend", "opencl").build({})
    backend.require_device()
    set_backend(backend)


def run(problem: Problem, recipe: Recipe, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        expected = problem.make_reference().double()(x.double())
        got = model(x)
        synchronize()
    assert got.shape == expected.shape
    return got, expected


def _special(shape: tuple[int, ...]) -> torch.Tensor:
    """Values in [0.5, 1.5) (products stay finite), a NaN in one column, +inf in a second, a column of
    -inf at its start, ties of the extreme in a fourth (the first index wins)."""
    torch.manual_seed(0)
    x = 0.5 + torch.rand(shape)
    x[0, 5, 1] = float("nan")
    x[0, 9, 1] = float("nan")
    x[1, 3, 2] = float("inf")
    x[0, :4, 3] = float("-inf")
    x[1, 2, 4] = x[1, 7, 4] = 3.0
    x[1, 2, 5] = x[1, 7, 5] = -3.0
    return x


@pytest.mark.usefixtures("_pocl")
@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize(("forward", "index"), FORWARDS)
def test_middle_dim_matches_torch(
    forward: str, index: bool, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small shapes standing for many outputs: 2 x 45 = 90 columns, a thread each (not a warp)
    monkeypatch.setattr(lowering, "STRIDED_OUT_MIN", 64)
    monkeypatch.setattr(lowering, "LANE_MIN", 4)
    shape = (2, 39, 45)  # 39 terms: nine steps of four loads, then three
    problem = problem_file(tmp_path, forward, shape)
    recipe = build(problem, name)
    assert "kf_lane" not in recipe.kernel
    x = _special(shape)
    if "cumsum" in forward:  # the compensated running sum turns an infinity into NaN (as it always did)
        x = torch.where(x.isinf(), torch.full_like(x, 2.0), x)
    got, expected = run(problem, recipe, x)
    if index:
        assert torch.equal(got.long(), expected.long())
    else:
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.usefixtures("_pocl")
@pytest.mark.parametrize(("forward", "index"), FORWARDS[:4])
def test_few_outputs_keep_the_lanes(
    forward: str, index: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the threshold the strided reduction still takes a warp per output (and stays correct)."""
    monkeypatch.setattr(lowering, "LANE_MIN", 4)
    shape = (2, 39, 45)
    problem = problem_file(tmp_path, forward, shape)
    recipe = build(problem, "graph/fused_coop")
    assert "kf_lane" in recipe.kernel
    got, expected = run(problem, recipe, _special(shape))
    if index:
        assert torch.equal(got.long(), expected.long())
    else:
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize(
    ("forward", "shape", "lanes"),
    [
        # KernelBench's argmin / prod (of |x|: a graph) / softmax over dim 1: 128 x 4095 outputs (64 x 4095 rows), strided
        ("torch.argmin(x, dim=1)", (128, 4096, 4095), False),
        ("torch.prod(x.abs(), dim=1)", (128, 4096, 4095), False),
        ("torch.softmax(x, dim=1)", (64, 4096, 4095), False),
        # the same over the innermost dim: the lanes read contiguous terms
        ("torch.argmin(x, dim=2)", (128, 4095, 4096), True),
        ("torch.prod(x.abs(), dim=2)", (128, 4095, 4096), True),
        ("torch.cumsum(x, dim=2)", (64, 4095, 4096), True),
        ("torch.cumsum(x, dim=1)", (64, 4096, 4095), False),
        # a trailing dim of one element: the reduced dim is the innermost in memory
        ("torch.prod(x.abs(), dim=1)", (65536, 256, 1), True),
        # strided with few outputs (4 x 64): a warp each still (the outputs alone cannot fill the GPU)
        ("torch.prod(x.abs(), dim=1)", (4, 4096, 64), True),
    ],
)
def test_warp_per_output_only_where_it_reads_contiguously(
    forward: str, shape: tuple[int, ...], lanes: bool, tmp_path: Path
) -> None:
    problem = problem_file(tmp_path, forward, shape)
    kernel = build(problem, "graph/fused_coop", "cuda").kernel
    assert ("kf_lane" in kernel) is lanes, kernel[-3000:]
    if not lanes:  # a thread per output: no ILP copies of the loop, four loads of it in flight
        assert "ILP * KF_GSTRIDE" not in kernel
        assert "v3 = " in kernel or "cumsum" in forward


def test_strided_is_the_innermost_dim_of_more_than_one_element() -> None:
    assert lowering.strided((4, 8, 16), [1]) and lowering.strided((4, 8, 16), [0, 1])
    assert not lowering.strided((4, 8, 16), [2]) and not lowering.strided((4, 8, 16), [1, 2])
    assert not lowering.strided((4, 8, 1), [1]) and lowering.strided((4, 1, 8, 1), [1])


#: KernelBench problems with a reduction or row op over a strided dim (their channels): a thread per row
#: when the threshold is lowered to their small shapes, through the real evaluator (NaN / inf trials too).
STRIDED_PROBLEMS = [
    "level1/argmin_dim.py",
    "level1/argmax_dim.py",
    "level1/prod_over_dim.py",
    "level1/softmax_dim1_3d.py",
    "level2/conv2d_min_tanh_tanh.py",
    "level2/conv2d_silu_tanh_sigmoid_logsoftmax.py",
    "level2/conv3d_softmax_maxpool_maxpool.py",
]


@pytest.mark.slow
@pytest.mark.parametrize("key", STRIDED_PROBLEMS)
def test_strided_problems_are_correct_on_pocl(
    key: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = Path(__file__).resolve().parent / "data" / "kernelbench"
    small = json.loads((data / "small_shapes.json").read_text())
    monkeypatch.setattr(lowering, "STRIDED_OUT_MIN", 8)
    monkeypatch.setattr(lowering, "LANE_MIN", 4)
    problem = load_problem(graph_problem_path(data / key, tmp_path), small[key])
    recipe = build(problem, "graph/fused_coop")
    assert "kf_lane" not in recipe.kernel
    with Evaluator(problem, fast_config(cache=False)) as evaluator:  # type: ignore[arg-type]
        record = evaluator.evaluate_many([recipe.candidate()])[0]
    assert record.outcome is Outcome.correct, f"{key}: {record.message}\n{(record.log or '')[-3000:]}"
