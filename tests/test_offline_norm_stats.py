"""Long normalisation rows' statistics in one split read (``lower_stats``), run on PoCL.

Batch, instance and group norm at sizes whose rows take the split path (>= ``SPLIT_MIN`` terms), with
row lengths that are and are not multiples of four (the 128-bit and the scalar loads), and inputs whose
mean is far from zero (the shifted sums must not cancel): compared with PyTorch in float64.
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
    ("level1/batch_norm.py", {"batch_size": 3, "features": 4, "dim1": 65, "dim2": 133}, "graph/fused"),
    ("level1/instance_norm.py", {"batch_size": 2, "features": 3, "dim1": 100, "dim2": 90}, "graph/fused"),
    (
        "level1/group_norm.py",
        {"batch_size": 2, "features": 8, "num_groups": 2, "dim1": 64, "dim2": 33},
        "graph/fused_coop",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


@pytest.mark.parametrize(("key", "dims", "name"), CASES)
def test_split_statistics_match_float64_with_a_large_mean(key: str, dims: dict[str, int], name: str) -> None:
    problem = load_problem(DATA / key, dims)
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", name, 1)
    assert "_stats(" in recipe.kernel  # the split path
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    ref = problem.make_reference()
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    x = 300.0 + 0.5 * problem.make_inputs(1)[0]  # mean 300, spread 0.5
    with torch.no_grad():
        expected = ref.double()(x.double())
        got = model(x)
        synchronize()
    err = (got.double() - expected).abs().max().item()
    assert err < 2e-3, f"{key}: max error {err}"
