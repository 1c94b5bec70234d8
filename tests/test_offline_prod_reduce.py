"""A product over one dimension in the reduction cookbook (``torch.prod(x, dim)``, ``x.prod(dim)``): its
algebra (``rowops``: one, ``*=``) in every recipe, OpenCL on PoCL and CUDA on the CPU emulation, against
float64 PyTorch; a product over all elements stays the graph lowering's."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import test_offline_cuda_emulated as emu
import torch

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
#: a middle dim (inner 37: vectors and a scalar tail) and values near one (a product of 64 stays finite)
SHAPE = {"batch_size": 3, "dim1": 64, "dim2": 37}


def _run(recipe: Any, problem: Any, x: torch.Tensor) -> torch.Tensor:
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        got = model(x)
        runtime.synchronize()
    return got


def _input() -> tuple[Any, torch.Tensor, torch.Tensor]:
    problem = load_problem(DATA / "level1/prod_over_dim.py", SHAPE)
    torch.manual_seed(0)
    x = problem.make_inputs(1)[0]
    x[0, 5, 3] = float("nan")  # one column NaN
    x[1, :, 7] = -x[1, :, 7]  # a column of negative factors (sign)
    x[2, 9, 11] = 0.0  # a zero factor
    with torch.no_grad():
        expected = problem.make_reference().double()(x.double()).float()
    return problem, x, expected


def test_prod_over_a_dim_is_a_reduction_and_a_full_product_is_not(tmp_path: Path) -> None:
    gen = OfflineGenerator()
    spec = gen.spec(load_problem(DATA / "level1/prod_over_dim.py", SHAPE).summary())
    assert (spec.family, spec.reduce_op, spec.R, spec.inner) == ("reduce", "prod", 64, 37)
    full = (
        (DATA / "level1/prod_over_dim.py").read_text().replace("torch.prod(x, dim=self.dim)", "torch.prod(x)")
    )
    assert full != (DATA / "level1/prod_over_dim.py").read_text()
    (tmp_path / "prod_all.py").write_text(full)
    assert gen.spec(load_problem(tmp_path / "prod_all.py", SHAPE).summary()).family == "graph"


@pytest.mark.usefixtures("pocl_runtime")
def test_every_opencl_recipe_multiplies_on_pocl() -> None:
    problem, x, expected = _input()
    recipes = OfflineGenerator().recipes(problem.summary(), "opencl")
    assert {r.name for r in recipes} >= {"reduce/naive", "reduce/inner_vector", "reduce/workgroup"}
    for recipe in recipes:
        got = _run(recipe, problem, x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True, msg=recipe.name)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_every_cuda_recipe_multiplies_on_the_cpu_emulation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "load", emu.emu_load)
    monkeypatch.setattr(runtime, "synchronize", lambda: None)
    problem, x, expected = _input()
    recipes = OfflineGenerator().recipes(problem.summary(), "cuda")
    assert "reduce/inner_split" in {r.name for r in recipes}
    for recipe in recipes:
        got = _run(recipe, problem, x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True, msg=recipe.name)
