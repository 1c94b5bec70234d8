"""Cheaper forms of elementwise math that stay within a few ulps: a division by a Python number is a
multiplication by its float32 reciprocal, ``expm1`` is one exponential (``kf_expm1``: its Taylor series
below |u| = 1), Mish is one exponential (tanh(log1p(e)) = n / (n + 2), n = e (e + 2)). Their accuracy is
checked on PoCL against float64 over a dense range and the special values; the CUDA sources compile."""

from __future__ import annotations

import math
import operator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.elementwise_ops import node_expr, reciprocal_literal
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from tests.offline_helpers import nvcc_resources, run_against_eager

PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {body}


def get_inputs():
    x = torch.cat([torch.linspace(-30.0, 30.0, 40001), torch.linspace(-1.5, 1.5, 30001),
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-8, -1e-8, 0.999999, 1.0, -1.0, 88.0, -104.0,
                                 float("inf"), -float("inf"), float("nan")])])
    return [x.reshape(1, -1)]


def get_init_inputs():
    return []
"""

CASES = {
    "expm1": ("torch.expm1(x)", lambda x: np.expm1(x)),
    "celu": ("F.celu(x, alpha=0.6)", lambda x: np.where(x > 0, x, 0.6 * np.expm1(x / 0.6))),
    "mish": ("F.mish(x)", lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    "divide": ("x / 0.7 - x / 3.0", lambda x: x / 0.7 - x / 3.0),
}


def _problem(tmp_path: Path, name: str) -> Any:
    path = tmp_path / f"{name}.py"
    path.write_text(PROBLEM.format(body=CASES[name][0]))
    return load_problem(path, {})


def _ulps(got: torch.Tensor, truth: np.ndarray) -> np.ndarray:
    """|got - truth| in float32 ulps of |truth| (an ulp floored at the smallest normal)."""
    g = got.double().numpy().reshape(-1)
    t = truth.reshape(-1)
    ulp = np.maximum(np.spacing(np.abs(t).astype(np.float32)).astype(np.float64), 2.0**-149 * 2**23)
    err = np.abs(g - t)
    both_nan = np.isnan(g) & np.isnan(t)
    same_inf = np.isinf(t) & (g == t)
    return np.where(both_nan | same_inf, 0.0, err / ulp)


def test_reciprocal_literal() -> None:
    assert reciprocal_literal(2.0) == 0.5 and reciprocal_literal(-0.25) == -4.0
    assert reciprocal_literal(0.6) == float(np.float32(1 / 0.6))
    for bad in (0.0, -0.0, math.inf, -math.inf, math.nan, 1e-39, 3e38):  # overflow / a subnormal reciprocal
        assert reciprocal_literal(bad) is None, bad


def test_division_by_a_number_is_a_product() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x / 0.6 + x / y + torch.div(x, 0.0)

    gm = fx.symbolic_trace(f)
    divs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.add]
    exprs = [node_expr(n, gm, lambda a: str(getattr(a, "name", a)), "cuda") for n in divs]
    assert exprs[0] == f"(x * {float(np.float32(1 / 0.6))!r}f)"
    assert exprs[1] == "(x / y)"  # a tensor divisor stays a division
    assert exprs[2] == "(x / 0.0)"  # as does a zero (inf / NaN as torch)


@pytest.mark.parametrize("name", sorted(CASES))
def test_opencl_recipes_within_a_few_ulps(pocl_runtime: None, tmp_path: Path, name: str) -> None:
    problem = _problem(tmp_path, name)
    recipes = OfflineGenerator().recipes(problem.summary(), "opencl")
    assert recipes
    if name in ("expm1", "celu"):
        assert all("kf_expm1(" in r.kernel and "KF_EXPM1_DEFINED" in r.kernel for r in recipes)
    x = problem.make_inputs(1)[0].double().numpy()
    with np.errstate(all="ignore"):
        truth = CASES[name][1](x)
    for recipe in recipes:
        got, expected = run_against_eager(problem, recipe)
        ulps = _ulps(got, truth)
        finite = np.isfinite(truth.reshape(-1))
        # the values torch's own float32 gets within a few ulps of (mish near its overflow: torch's too)
        assert np.isnan(got.numpy().reshape(-1)[~finite & np.isnan(truth.reshape(-1))]).all(), recipe.name
        assert float(np.max(ulps[finite])) <= 8.0, (recipe.name, float(np.max(ulps[finite])))
        assert float(np.sqrt(np.mean(ulps[finite] ** 2))) <= 1.5, recipe.name


def test_cuda_recipes_compile(tmp_path: Path) -> None:
    problem = _problem(tmp_path, "celu")
    recipes = OfflineGenerator().recipes(problem.summary(), "cuda")
    assert recipes
    for recipe in recipes:
        assert "kf_expm1(" in recipe.kernel and "KF_EXPM1_DEFINED" in recipe.kernel, recipe.name
        assert "expm1f(" not in recipe.kernel, recipe.name
        defines = {k: v for k, v in recipe.defaults.items() if isinstance(v, int)}
        report = nvcc_resources(recipe.kernel, defines, tmp_path)
        assert "spill" not in report or "0 bytes spill" in report, (recipe.name, report)


def test_triton_forms_of_the_helpers() -> None:
    """The Triton text of ``kf_mish`` / ``kf_expm1`` evaluates to mish / expm1 (torch standing in for tl)."""
    from types import SimpleNamespace

    from kfoundry.plugins.llms.offline.triton_expr import triton_expr

    tl = SimpleNamespace(where=torch.where, exp=torch.exp)
    v0 = torch.linspace(-30.0, 30.0, 6001, dtype=torch.float64)
    mish = eval(triton_expr("kf_mish(v0)"), {"tl": tl, "v0": v0})  # noqa: S307 - our own generated text
    torch.testing.assert_close(mish, F.mish(v0), rtol=1e-12, atol=1e-12)
    expm1 = eval(triton_expr("kf_expm1(v0)"), {"tl": tl, "v0": v0})  # noqa: S307
    torch.testing.assert_close(expm1, torch.expm1(v0), rtol=1e-9, atol=1e-12)
