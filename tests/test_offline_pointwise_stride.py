"""The fused pointwise kernels step their coordinates by the grid stride's mixed-radix digits
(``Lowering._quads``: no division inside the grid-stride loop) and, where the output's last dim is a
multiple of 4, read each operand row's four elements of a quad with one 16-byte load
(``Lowering._quad_loads``). Checked on PoCL with the grid cut to two work-groups, so that every thread takes
many steps and the carries cross every dimension, on shapes whose sizes are not multiples of 4 or of each
other and on shapes that take the 16-byte loads (broadcast rows, guards, a permuted operand, a cat),
against eager PyTorch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.runtime import load, synchronize
from tests.offline_helpers import GRID_CAP, pointwise_problem

pytestmark = pytest.mark.usefixtures("pocl_runtime")

TEST_CAP = "min(_cdiv(int(n), b), 2)"


#: (forward, input shapes): pointwise chains over 1-4 dims, broadcasts, a permuted view, a global norm
CASES = [
    ("torch.relu(x0) * x1 + x0.sum()", [(1001,), (1001,)]),
    ("x0 * x1 + torch.tanh(x0)", [(3, 5, 7, 9), (5, 1, 9)]),
    ("torch.sigmoid(x0.permute(0, 2, 1)) - x1", [(6, 11, 13), (6, 13, 11)]),
    ("F.leaky_relu(x0 + x1, 0.1)", [(7, 3, 1, 17), (1, 3, 5, 1)]),
    ("x0 / torch.norm(x0, p='fro')", [(3, 7, 5, 11)]),
    # last dims of multiples of 4: the 16-byte quads (a broadcast row, a guard, a permuted operand, a cat
    # whose operands do not cover the output's last dim)
    ("F.leaky_relu(x0 + x1, 0.1) + x0.sum()", [(7, 3, 5, 12), (1, 3, 1, 12)]),
    ("torch.where(x0 > 0, x0, x1) * 2 + x0.sum()", [(5, 6, 16), (6, 16)]),
    ("torch.sigmoid(x0.permute(0, 2, 1)) - x1 + x1.sum()", [(6, 12, 8), (6, 8, 12)]),
    ("torch.cat([x0, x1], dim=-1) * 3 + x0.sum()", [(9, 8), (9, 4)]),
]


#: the cases whose shapes take the 16-byte quads at run time
VECTOR = [c for c in CASES if c[0] in {CASES[5][0], CASES[6][0], CASES[7][0]}]


def _run(
    tmp: Path, forward: str, shapes: list[Any], broken: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(got, expected) of graph/fused on PoCL with the grid cut to two work-groups; ``broken``: the 16-byte
    quads read the first element of each float4 four times (a wrong kernel, to show the path runs)."""
    problem = pointwise_problem(tmp, forward, shapes)
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", "graph/fused", 1)
    source = recipe.render()
    assert GRID_CAP in source and "kf_qs0" in source, "the pointwise kernel or its launch changed shape"
    if broken:
        assert "kf_ql0[kq]" in source, "no 16-byte quad variant"
        source = source.replace("kf_ql0[kq]", "kf_ql0[0]")
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(source.replace(GRID_CAP, TEST_CAP), recipe.name, "exec"), namespace)  # noqa: S102
    torch.manual_seed(0)
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = problem.make_reference()(*inputs)
        got = namespace["ModelNew"](*problem.make_init_inputs())(*inputs)
        synchronize()
    assert got.shape == expected.shape
    return got, expected


@pytest.mark.parametrize(("forward", "shapes"), CASES)
def test_grid_stride_steps_keep_every_coordinate(tmp_path: Path, forward: str, shapes: list[Any]) -> None:
    got, expected = _run(tmp_path, forward, shapes)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("forward", "shapes"), VECTOR)
def test_the_16_byte_quads_run_where_the_last_dim_allows(
    tmp_path: Path, forward: str, shapes: list[Any]
) -> None:
    """The 16-byte variant is the one that runs at these shapes: breaking it changes the result."""
    got, expected = _run(tmp_path, forward, shapes, broken=True)
    assert not torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
