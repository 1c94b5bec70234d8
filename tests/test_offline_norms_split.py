"""Long normalisation rows in three kernels (``lower_stats.normalise``), run on PoCL against float64.

Group, instance, batch and layer norm with and without affine parameters (random ones, so a wrong
parameter index shows), eps other than the default, group lengths that are and are not multiples of
four, spatial sizes below four (a float4 spanning channels), few long groups (pieces with a partial
last one) and many short ones (the rows path), inputs with a mean far from zero, in every schedule.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph, lower_norm_stream
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.runtime import load, synchronize

_SRC = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.n = {module}

    def forward(self, x):
        return self.n(x)

def get_inputs():
    return [torch.rand({shape})]

def get_init_inputs():
    return []
"""

CASES = [
    # (module, input shape, goes through the split path)
    ("nn.GroupNorm(3, 6, eps=1e-3)", (2, 6, 50, 90), True),  # 2 channels x 4500 per group, float4
    ("nn.GroupNorm(2, 6)", (2, 6, 45, 91), True),  # 3 x 4095: not a multiple of 4 (scalar loads)
    ("nn.GroupNorm(2, 8192)", (2, 8192, 2), True),  # spatial 2: a float4 spans two channels
    ("nn.GroupNorm(1, 4, affine=False)", (1, 4, 128, 130), True),  # one long group, 17 pieces
    ("nn.GroupNorm(8, 16)", (4, 16, 8, 8), False),  # many short groups
    ("nn.InstanceNorm2d(3, affine=True, eps=1e-3)", (2, 3, 100, 90), True),
    ("nn.InstanceNorm2d(3)", (2, 3, 100, 90), True),
    ("nn.BatchNorm2d(4, affine=False, eps=1e-2)", (3, 4, 65, 133), True),
    ("nn.BatchNorm2d(4)", (3, 4, 64, 64), True),
]
SCHEDULES = ["graph/fused", "graph/fused_coop", "graph/unfused"]


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def _check(
    tmp_path: Path, module: str, shape: tuple[int, ...], schedule: str, marker: str, want: bool
) -> None:
    path = tmp_path / "norm.py"
    path.write_text(_SRC.format(module=module, shape=shape))
    problem = load_problem(path)
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "opencl", schedule, 1)
    if schedule != "graph/unfused":
        assert (marker in recipe.kernel) == want, recipe.kernel[:2000]
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    ref = problem.make_reference()
    model = namespace["ModelNew"](*problem.make_init_inputs())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for (name, a), b in zip(ref.named_parameters(), model.parameters(), strict=True):
            v = (
                torch.randn(a.shape, generator=gen)
                if name.endswith("bias")
                else 0.5 + torch.rand(a.shape, generator=gen)
            )
            a.copy_(v)
            b.copy_(v)
    x = 300.0 + 0.5 * torch.rand(shape, generator=gen)  # mean 300, spread 0.5: shifted sums must not cancel
    with torch.no_grad():
        expected = ref.double()(x.double())
        got = model(x)
        synchronize()
    err = (got.double() - expected).abs().max().item()
    assert err < 2e-3, f"{module} {shape} {schedule}: max error {err}"


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("module", "shape", "split"), CASES)
def test_norm_matches_float64(
    tmp_path: Path, module: str, shape: tuple[int, ...], split: bool, schedule: str
) -> None:
    _check(tmp_path, module, shape, schedule, "_fold(", split)  # three kernels where the rows are long


@pytest.mark.slow  # PoCL spins its work-groups' waits on two cores: ~25 s a case
@pytest.mark.parametrize(("module", "shape", "split"), [c for c in CASES if "Batch" not in c[0]])
def test_norm_stream_matches_float64(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, shape: tuple[int, ...], split: bool
) -> None:
    """The one-kernel stream (CUDA's fused_coop) on PoCL: tickets, arrivals, the last piece's merge."""
    monkeypatch.setattr(lower_norm_stream, "OPENCL", True)
    _check(tmp_path, module, shape, "graph/fused", "_stream(", split)
