"""Cheaper forms of elementwise math that stay within a few ulps: a division by a Python number is a
multiplication by its float32 reciprocal, ``expm1`` is one range-reduced polynomial (``kf_expm1``), tanh
one exp2 and one reciprocal (``kf_tanh``, the CUDA recipes' FAST form), sigmoid's quotient a reciprocal
(``kf_rcp``), Mish one exponential (tanh(log1p(e)) = n / (n + 2), n = e (e + 2)); torch.trunc's and
torch.sign's where-compositions one instruction or three; a CUDA ternary a select (``kf_sel``). The
helpers' accuracy is checked on PoCL against float64 over dense ranges and the special values, scalar and
vector; the exact rewrites bit for bit; the CUDA sources compile."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.cookbook_elementwise import select_forms
from kfoundry.plugins.llms.offline.elementwise_ops import (
    exact_forms,
    helper_source,
    node_expr,
    reciprocal_literal,
)
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.recipe import OPENCL_VECTOR_HELPERS
from kfoundry.runtime import load, synchronize
from tests.offline_helpers import nvcc_resources, run_against_eager

KB = Path(__file__).resolve().parent / "data" / "kernelbench" / "level1"

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
    # the logistic family through kf_softplus: the module, log-sigmoid, and log1p(exp(.)) as written
    "logistic": (
        "F.softplus(x) - F.logsigmoid(x * 0.5) + torch.log1p(torch.exp(-x)) * 0.25",  # terms >= 0
        lambda x: np.logaddexp(0.0, x) + np.logaddexp(0.0, -x * 0.5) + np.logaddexp(0.0, -x) * 0.25,
    ),
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
    # a float argument of the kernel (a mean's count): a product with its reciprocal, computed once
    args = {divs[1].args[1]: "f0", divs[1].args[0]: "x"}
    assert node_expr(divs[1], gm, lambda a: args.get(a, str(a)), "cuda") == "(x * (1.0f / f0))"


@pytest.mark.parametrize("name", sorted(CASES))
def test_opencl_recipes_within_a_few_ulps(pocl_runtime: None, tmp_path: Path, name: str) -> None:
    problem = _problem(tmp_path, name)
    recipes = OfflineGenerator().recipes(problem.summary(), "opencl")
    assert recipes
    if name in ("expm1", "celu"):
        assert all("kf_expm1(" in r.kernel and "KF_EXPM1_DEFINED" in r.kernel for r in recipes)
    if name == "logistic":  # no log1p of an exp is left (the helper's own text aside)
        assert all(r.kernel.count("kf_softplus(") >= 4 and "log1p(exp" not in r.kernel for r in recipes)
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


#: the helpers' own thresholds (kf_tanh's 0.55, kf_expm1's clamps and overflow), limits and IEEE specials
_SPECIALS = (
    "0 -0 1e-45 -1e-45 1e-40 -1e-40 0.55 -0.55 0.5499999 -0.5499999 0.5500001 9.01 17.3 -17.4 -30 -30.5 "
    "44.4 88.72 88.7228 88.7229 88.75 88.76 89 100 -88 -100 -104 1e30 -1e30 3.4e38 -3.4e38 inf -inf nan"
)


def _special_inputs() -> np.ndarray:
    """Dense ranges, both signs over many magnitudes, kf_expm1's reduction edges and :data:`_SPECIALS`."""
    mags = np.concatenate([np.geomspace(1e-38, 1e-30, 50), np.geomspace(1e-30, 3e38, 20001)])
    edges = [k * math.log(2.0) / 2 + np.linspace(-1e-5, 1e-5, 21) for k in range(-130, 131)]
    dense = [
        np.linspace(-30.0, 30.0, 60001),
        np.linspace(-1.5, 1.5, 30001),
        np.linspace(-100.0, 100.0, 20001),
    ]
    specials = np.array(_SPECIALS.split(), dtype=np.float64)
    return np.concatenate([*dense, mags, -mags, *edges, specials]).astype(np.float32)


#: helper, its float64 truth, max ulps, RMS ulps allowed on PoCL (where exp2 and the quotient are
#: OpenCL's; the CUDA forms, MUFU.EX2/RCP, for every float on a GPU: test_offline_fast_math_cuda.py)
HELPERS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float, float]] = {
    "kf_expm1": (np.expm1, 1.6, 0.35),
    "kf_tanh": (np.tanh, 2.0, 0.35),
    "kf_rcp": (lambda x: 1.0 / x, 0.51, 0.3),
    "kf_mish": (lambda x: x * np.tanh(np.log1p(np.exp(x))), 4.0, 0.6),
    "kf_softplus": (lambda x: np.logaddexp(0.0, x), 3.6, 0.5),
}


def _run_helper(name: str, x: np.ndarray, vw: int | None) -> np.ndarray:
    """``name`` applied to every element of ``x`` on PoCL: its float instance (vw None) or its floatv one."""
    head, guard, value = ("", "i < n", f"Y[i] = {name}(X[i])")
    if vw:
        head, guard, value = (
            OPENCL_VECTOR_HELPERS,
            "i * VW + VW <= n",
            f"VSTOREV({name}(VLOADV(i, X)), i, Y)",
        )
    src = f"""{head}{helper_source(name, "opencl")}
__kernel void apply(__global const float* restrict X, __global float* restrict Y, int n) {{
    int i = get_global_id(0);
    if ({guard}) {value};
}}"""
    width = vw or 1
    n = len(x) - len(x) % width
    xt = torch.from_numpy(np.ascontiguousarray(x[:n]))
    yt = torch.empty_like(xt)
    prog = load(src, defines={"VW": vw} if vw else {})
    prog.apply(xt, yt, n, grid=(-(-n // width // 64), 1, 1), block=(64, 1, 1))
    synchronize()
    return yt.numpy()


@pytest.mark.parametrize("vw", [None, 2, 4, 8])
@pytest.mark.parametrize("name", sorted(HELPERS))
def test_helpers_within_a_few_ulps_on_pocl(pocl_runtime: None, name: str, vw: int | None) -> None:
    """Each helper (scalar and vector instance) against float64: max and RMS ulps, NaN and +-inf kept."""
    truth_of, max_ulps, rms_ulps = HELPERS[name]
    x = _special_inputs()
    if name == "kf_rcp":  # its domain: sigmoid's divisor 1 + exp(-x) >= 1
        x = np.abs(x[np.isfinite(x)]) + np.float32(1.0)
        x = np.concatenate([x, np.array([math.inf, math.nan], np.float32)])
    width = vw or 1
    x = x[: len(x) - len(x) % width]
    got = _run_helper(name, x, vw)
    with np.errstate(all="ignore"):
        truth = truth_of(x.astype(np.float64))
    truth = np.where(np.abs(truth) > float(np.finfo(np.float32).max), np.sign(truth) * np.inf, truth)
    ulps = _ulps(torch.from_numpy(got), truth)
    finite = np.isfinite(truth)
    assert np.isnan(got[np.isnan(truth)]).all(), name
    assert (got[np.isinf(truth)] == truth[np.isinf(truth)]).all(), name
    worst, rms = float(np.max(ulps[finite])), float(np.sqrt(np.mean(ulps[finite] ** 2)))
    at = float(x[finite][np.argmax(ulps[finite])])
    assert worst <= max_ulps and rms <= rms_ulps, (name, vw, worst, rms, at)


#: inputs of test_expm1_and_tanh_keep_their_limits, by index
_LIMITS = "0 -0 inf -inf -1e30 1e30 88.7 88.73 -17.5 1e-40 44 45"


def test_expm1_and_tanh_keep_their_limits(pocl_runtime: None) -> None:
    x = np.array(_LIMITS.split(), dtype=np.float32)
    e = _run_helper("kf_expm1", x, None)
    assert np.isinf(e[2]) and e[2] > 0 and e[3] == -1.0 and e[4] == -1.0 and np.isinf(e[5]) and e[8] == -1.0
    assert np.isfinite(e[6]) and np.isinf(e[7]) and e[9] == x[9] and e[0] == 0.0 and e[1] == 0.0
    t = _run_helper("kf_tanh", x, None)
    assert list(t[2:6]) == [1.0, -1.0, -1.0, 1.0] and t[10] == 1.0 and t[11] == 1.0 and t[9] == x[9]
    assert np.signbit(t[1]) and not np.signbit(t[0])


def test_exact_forms_write_trunc() -> None:
    kept = "(((x) < (0.0f)) ? (ceilf(y)) : (floorf(y)))"  # not one operand thrice: left as it is
    cuda = f"(((((v0 * 3.0f)) < (0.0f)) ? (ceilf((v0 * 3.0f))) : (floorf((v0 * 3.0f)))) + {kept})"
    assert exact_forms(cuda, "cuda") == f"(truncf((v0 * 3.0f)) + {kept})"
    ocl = cuda.replace("ceilf", "ceil").replace("floorf", "floor")
    assert exact_forms(ocl, "opencl").startswith("(trunc((v0 * 3.0f)) + ")
    assert exact_forms("((v0) < 0.0f ? ceilf(v0) : v0)", "cuda") == "((v0) < 0.0f ? ceilf(v0) : v0)"


SIGN_TRUNC = "torch.sign(x) * torch.trunc(x * 3) + x.frac() + torch.trunc(x)"


def test_sign_trunc_frac_bit_for_bit(pocl_runtime: None, tmp_path: Path) -> None:
    """trunc as trunc() and sign as a difference of 1.0/0.0 values: torch's values exactly (-0, NaN, inf)."""
    path = tmp_path / "sign_trunc.py"
    path.write_text(PROBLEM.format(body=SIGN_TRUNC))
    problem = load_problem(path, {})
    spec = OfflineGenerator().spec(problem.summary())
    assert spec.expr is not None
    cuda_kernels = [r.kernel for r in OfflineGenerator().recipes(problem.summary(), "cuda")]
    assert all("truncf(" in k and "ceilf(" not in k and "floorf(" not in k for k in cuda_kernels)
    for recipe in OfflineGenerator().recipes(problem.summary(), "opencl"):
        assert "trunc(" in recipe.kernel and "ceil(" not in recipe.kernel, recipe.name
        got, expected = run_against_eager(problem, recipe)
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


#: CUDA's names of the expressions' functions and FAST macros, as OpenCL C (the select test runs on PoCL)
_AS_OPENCL = """
#define expf exp
#define logf log
#define log1pf log1p
#define truncf trunc
#define ceilf ceil
#define floorf floor
#define fabsf fabs
#define fmaxf fmax
#define fminf fmin
#define tanhf tanh
#define erff erf
#define sqrtf sqrt
static inline float kf_sel(bool c, float a, float b) { return c ? a : b; }
"""


SELECT_KEYS = [
    "sign_trunc_masked_fill",
    "shrink_threshold_activations",
    "selu",
    "elu_alpha",
    "hardsigmoid",
    "softplus",
]


@pytest.mark.parametrize("key", SELECT_KEYS)
def test_selects_keep_the_values_bit_for_bit(pocl_runtime: None, key: str) -> None:
    """``select_forms``' kf_sel text and the ternary text it came from give the same bits (PoCL)."""
    spec = OfflineGenerator().spec(load_problem(KB / f"{key}.py", {}).summary())
    assert spec.expr is not None and spec.expr_lets is not None
    plain = spec.expr("cuda")
    sel = select_forms(plain)
    assert "?" not in sel and sel.count("kf_sel(") == plain.count("?"), sel
    lets = select_forms(spec.expr_lets("cuda"))
    assert "?" not in lets and lets.count("kf_sel(") == spec.expr_lets("cuda").count("?")
    src = f"""{_AS_OPENCL}{prelude_of(plain)}
__kernel void both(__global const float* X, __global float* A, __global float* B, int n) {{
    int i = get_global_id(0);
    if (i >= n) return;
    float v0 = X[i];
    A[i] = {plain};
    B[i] = {sel};
}}"""
    x = torch.from_numpy(_special_inputs())
    a, b = torch.empty_like(x), torch.empty_like(x)
    load(src).both(x, a, b, x.numel(), grid=(-(-x.numel() // 64), 1, 1), block=(64, 1, 1))
    synchronize()
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    assert torch.equal(torch.signbit(a), torch.signbit(b))


def prelude_of(expr: str) -> str:
    return "".join(
        helper_source(n, "opencl") for n in ("kf_expm1", "kf_mish", "kf_softplus") if f"{n}(" in expr
    )


def test_selects_leave_other_text_alone() -> None:
    assert select_forms("(v0 + 1.0f)") == "(v0 + 1.0f)"
    assert select_forms("((float)(v0) > 0.0f ? 1.0f : 0.0f)") == "((float)(v0) > 0.0f ? 1.0f : 0.0f)"
    assert select_forms("((v0) < 0.0f ? -(v0) : (v0))") == "kf_sel((v0 < 0.0f), (-v0), v0)"
    assert select_forms("(a ? b ? c : d : e)") == "kf_sel(a, kf_sel(b, c, d), e)"
    assert select_forms("(c ? x - y - z * w / u : 0.0f)") == "kf_sel(c, ((x - y) - ((z * w) / u)), 0.0f)"
    deep = "(v0 < 0.0f ? 1.0f : v0)"
    for _ in range(500):  # past Python's stack: left as it is
        deep = f"({deep} + 1.0f)"
    assert select_forms(deep) == deep


@pytest.mark.parametrize(
    "key", ["shrink_threshold_activations", "sign_trunc_masked_fill", "mingpt_gelu", "swish"]
)
def test_fast_cuda_recipes_use_the_cheap_forms(tmp_path: Path, key: str) -> None:
    """The FAST CUDA recipes: tanh as kf_tanh, sigmoid's quotient as kf_rcp, every ternary a kf_sel; FAST
    on by default; each compiles (nvcc, sm_90) under FAST 1 and 0 without spills."""
    problem = load_problem(KB / f"{key}.py", {})
    for recipe in OfflineGenerator().recipes(problem.summary(), "cuda"):
        if recipe.name not in ("elementwise/vector_ilp", "elementwise/vector_blocked"):
            continue
        body = recipe.kernel[recipe.kernel.index("__global__") :]
        lanes = [line for line in body.splitlines() if "r.x = " in line]
        assert recipe.defaults["FAST"] == 1 and lanes and not any("?" in line for line in lanes), recipe.name
        assert ("KF_TANHF(" in body) == (key in ("shrink_threshold_activations", "mingpt_gelu"))
        assert ("KF_RCP1P(" in body) == (key in ("sign_trunc_masked_fill", "swish")), recipe.name
        assert ("kf_sel(" in body) == (key in ("shrink_threshold_activations", "sign_trunc_masked_fill"))
        for fast in (1, 0):
            defines = {k: v for k, v in recipe.defaults.items() if isinstance(v, int)} | {"FAST": fast}
            report = nvcc_resources(recipe.kernel, defines, tmp_path)
            assert "spill" not in report or "0 bytes spill" in report, (recipe.name, report)
