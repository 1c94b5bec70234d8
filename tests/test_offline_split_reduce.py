"""Long reductions of fused loaders (a loss's per-element term) split across the grid
(``lower_split.grid_reduce``): work-groups of pieces to partials, then a work-group per output folds them
and applies the epilogue. Run on PoCL against PyTorch in float64 at small shapes (row mode, where the
innermost reduced dim is long, and flat mode, broadcast targets, ragged last pieces), and the schedule's
decision at the real KernelBench sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph, lower_split
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.runtime import load, synchronize
from tests.offline_helpers import run_against_float64

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

CASES = [
    # row mode: 37 rows of 1000 (>= ROW_MIN), 10 pieces of 4 rows, the last one row
    ("level1/mse_loss.py", {"batch_size": 37, "dim": 1000}),
    # flat mode (last dim 150 < ROW_MIN), targets broadcast along the last dim, 22500 terms: 6 pieces, ragged
    ("level1/hinge_loss.py", {"batch_size": 150, "dim": 150}),
    # batchmean: the sum divided by the batch; rows of 600
    ("level1/kl_div_loss.py", {"batch_size": 21, "dim": 600}),
    ("level1/huber_loss.py", {"batch_size": 19, "dim": 777}),
]


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def _recipe(key: str, dims: dict[str, int | float] | None, name: str) -> tuple[Any, Any]:
    problem = load_problem(DATA / key, dims)
    return problem, cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", name, 1)


@pytest.mark.parametrize("name", ["graph/fused", "graph/fused_coop", "graph/unfused"])
@pytest.mark.parametrize(("key", "dims"), CASES)
def test_split_loss_matches_float64(key: str, dims: dict[str, int | float], name: str) -> None:
    problem, recipe = _recipe(key, dims, name)
    assert "gpart(" in recipe.kernel  # the grid split
    got, expected = run_against_float64(problem, recipe)
    err = ((got - expected).abs() / (expected.abs() + 1e-3)).max().item()
    assert err < 1e-4, f"{key} {name}: max relative error {err}"


def test_pieces_fill_the_grid_at_real_sizes() -> None:
    # mse_loss at 32768 x 32768: one output, 8192 pieces of 4 rows (was a warp folding 2^20 partials)
    assert lower_split.pieces(1, 1 << 30, 32768) == (8192, 4)
    # kl_div 16384^2: 8192 pieces of 2 rows
    assert lower_split.pieces(1, 1 << 28, 16384) == (8192, 2)
    # many outputs: one piece each once the outputs fill the grid
    assert lower_split.pieces(16384, 65536, 256)[0] == 1
    # short reductions stay one piece
    assert lower_split.pieces(1, 3000, 1) == (1, 3000)


@pytest.mark.parametrize("key", ["level1/mse_loss.py", "level1/hinge_loss.py", "level1/kl_div_loss.py"])
def test_real_sizes_take_the_split(key: str) -> None:
    _, recipe = _recipe(key, None, "graph/fused_coop")
    assert "gpart(" in recipe.kernel


@pytest.mark.parametrize("name", ["graph/fused", "graph/fused_coop", "graph/unfused"])
def test_one_pass_logsumexp_matches_torch_with_infinities(name: str) -> None:
    problem, recipe = _recipe("level1/logsumexp_dim.py", {"batch_size": 7, "dim": 300}, name)
    # the running max of the one-pass form (one value per step, or eight loads in flight per step)
    assert "mx = v;" in recipe.kernel or "mx = mn;" in recipe.kernel
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    torch.manual_seed(0)
    x = 30.0 * torch.randn(7, 300)
    x[1] = -float("inf")  # every term -inf: -inf
    x[2, 5] = float("inf")  # one +inf: +inf
    x[3, 299] = float("nan")  # NaN anywhere: NaN
    x[4, ::3] = -float("inf")  # some -inf terms add nothing
    x[5] = torch.arange(300.0)  # the max grows at every term
    with torch.no_grad():
        expected = torch.logsumexp(x.double(), dim=1)
        got = model(x)
        synchronize()
    assert got.shape == expected.shape
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("name", ["graph/fused", "graph/fused_coop", "graph/unfused"])
def test_cosine_rows_read_each_input_once(name: str) -> None:
    problem, recipe = _recipe("level1/cosine_similarity_loss.py", {"batch_size": 9, "dim": 1000}, name)
    assert "na_p += va * va" in recipe.kernel  # the three sums in one loop
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    torch.manual_seed(0)
    xs = [torch.randn(9, 1000), torch.randn(9, 1000)]
    with torch.no_grad():
        expected = problem.make_reference().double()(*[x.double() for x in xs])
        got = model(*xs)
        synchronize()
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)
