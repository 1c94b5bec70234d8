"""Shared helpers of the offline-generator tests: a recipe run against eager PyTorch, and nvcc's
resource report for a generated CUDA source."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import Any

import torch

from kfoundry.core.problem import load_problem
from kfoundry.runtime import load, synchronize


def run_against_eager(
    problem: Any, recipe: Any, params: dict[str, Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(got, expected): ``recipe``'s ``ModelNew`` (initialised as the reference, seed 0) and the eager
    reference on the same inputs (seed 1), under ``no_grad``; the shapes are checked to match."""
    namespace: dict[str, Any] = {
        "PARAMS": dict(params or recipe.defaults),
        "__name__": "kf_candidate",
        "load": load,
    }
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own
    torch.manual_seed(0)
    ref = problem.make_reference()
    inputs = problem.make_inputs(1)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        expected = ref(*inputs)
        got = model(*inputs)
        synchronize()
    assert got.shape == expected.shape, recipe.name
    return got, expected


def run_against_float64(problem: Any, recipe: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(got, expected) in float64: ``recipe``'s ``ModelNew`` on the inputs (seed 0) and the reference run
    in float64 on the same inputs, under ``no_grad``; the shapes are checked to match."""
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own
    ref = problem.make_reference()
    model = namespace["ModelNew"](*problem.make_init_inputs())
    torch.manual_seed(0)
    xs = problem.make_inputs(1)
    with torch.no_grad():
        expected = ref.double()(*[x.double() for x in xs])
        got = model(*xs)
        synchronize()
    assert got.shape == expected.shape, recipe.name
    return got.double(), expected


def nvcc_resources(source: str, defines: dict[str, Any], tmp_path: Path) -> str:
    """nvcc's ``--resource-usage`` report of ``source`` compiled for sm_90 with ``defines`` (asserted to
    compile)."""
    src = tmp_path / "k.cu"
    src.write_text(source)
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    cmd = [
        "nvcc",
        "-arch=sm_90",
        "-cubin",
        "--resource-usage",
        "-o",
        str(tmp_path / "k.cubin"),
        *flags,
        str(src),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


#: the pointwise launch's grid cap in a rendered graph recipe (tests cut it to cross the grid stride)
GRID_CAP = "min(_cdiv(int(n), b), 8192)"


def pointwise_problem(tmp: Path, forward: str, shapes: list[tuple[int, ...]]) -> Any:
    """A KernelBench problem in ``tmp`` whose forward returns ``forward`` over random inputs ``x0, x1, ...``
    of ``shapes``."""
    args = ", ".join(f"x{i}" for i in range(len(shapes)))
    inputs = ", ".join(f"torch.randn{s}" for s in shapes)
    src = f"""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, {args}):
                return {forward}

        def get_inputs():
            return [{inputs}]

        def get_init_inputs():
            return []
        """
    path = tmp / "problem.py"
    path.write_text(textwrap.dedent(src))
    return load_problem(path, {})


#: Problems whose plain form is a family's (a product over one dim: the reduction cookbook's), with the
#: edit that sends them to the graph lowering (an elementwise step in front: the same values, NaN too)
AS_GRAPH = {"prod_over_dim.py": ("torch.prod(x, dim=self.dim)", "torch.prod(x.abs(), dim=self.dim)")}


def graph_problem_path(path: Path, tmp: Path) -> Path:
    """``path``, or where it is in :data:`AS_GRAPH`, its graph form written under ``tmp``."""
    if path.name not in AS_GRAPH:
        return path
    plain, graph = AS_GRAPH[path.name]
    text = path.read_text()
    assert plain in text, path
    out = tmp / path.name
    out.write_text(text.replace(plain, graph))
    return out


def slow_volumes(cases: list[tuple[str, tuple[int, ...]]], keep: int = 1) -> list[Any]:
    """``(layer, shape)`` cases with the 3-D ones (5-D shapes: the slowest on PoCL) marked ``slow`` but
    the last ``keep`` of them: the default run keeps one volume case, the slow tier has them all."""
    import pytest

    volumes = [k for k, (_, shape) in enumerate(cases) if len(shape) == 5]
    slow = set(volumes[: len(volumes) - keep]) if keep else set(volumes)
    return [pytest.param(*c, marks=pytest.mark.slow) if k in slow else c for k, c in enumerate(cases)]
