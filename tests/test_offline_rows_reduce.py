"""Long reductions over a buffer's trailing dims as work-group pieces (``lower_stats.block_reduce``) and the
fused pointwise kernels' four-element path (``Lowering._quads``), run on PoCL against PyTorch in float64.

The shapes take the piece path (>= ``SPLIT_MIN`` terms per output): runs that are and are not multiples of
four (the 128-bit and the scalar loads), one and several pieces per output, a last piece shorter than the
rest; the outputs' last dimensions are and are not multiples of four (the quads and the one-element loop).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.runtime import load, synchronize

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

CASES = [
    # one output over 2*3*41*43 = 10578 terms (scalar loads); x / norm over a last dim of 43 (one element)
    ("level1/frobenius_norm.py", {"batch_size": 2, "features": 3, "dim1": 41, "dim2": 43}, "graph/fused"),
    # 3 rows of 40000 = 3 pieces each, the last 7232 long (float4 loads); quads over 40000
    ("level1/l2_norm.py", {"batch_size": 3, "dim": 40000}, "graph/fused"),
    # the cooperative schedule (32-item work-groups here): 2 pieces of float4 loads, quads over 64
    (
        "level1/frobenius_norm.py",
        {"batch_size": 2, "features": 4, "dim1": 64, "dim2": 64},
        "graph/fused_coop",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


@pytest.mark.parametrize(("key", "dims", "name"), CASES)
def test_piece_reductions_match_float64(key: str, dims: dict[str, int], name: str) -> None:
    problem = load_problem(DATA / key, dims)
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", name, 1)
    assert "piece(" in recipe.kernel and "KF_STORE4(y," in recipe.kernel  # the piece and quad paths
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    ref = problem.make_reference()
    model = namespace["ModelNew"](*problem.make_init_inputs())
    torch.manual_seed(0)
    x = 1.0 + problem.make_inputs(1)[0]
    with torch.no_grad():
        expected = ref.double()(x.double())
        got = model(x)
        synchronize()
    assert got.shape == expected.shape
    err = ((got.double() - expected).abs() / (expected.abs() + 1e-3)).max().item()
    assert err < 1e-4, f"{key}: max relative error {err}"
