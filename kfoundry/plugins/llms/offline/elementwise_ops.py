"""Elementwise torch operations as C expressions (OpenCL C and CUDA), read from an fx graph node."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from kfoundry.core.generator import GeneratorUnsupported

#: Math functions whose CUDA single-precision name adds an ``f``.
_MATH = {
    "log2",
    "log10",
    "exp2",
    "floor",
    "ceil",
    "tan",
    "exp",
    "log",
    "tanh",
    "erf",
    "sqrt",
    "rsqrt",
    "fabs",
    "sin",
    "cos",
    "log1p",
    "fmax",
    "fmin",
    "pow",
    "expm1",
}


#: OpenCL helpers that replace slow PoCL library calls (PoCL lowers ``erf`` to a scalar call).
OPENCL_MATH_PRELUDE = """
// Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7), odd extension; for float and floatv
#define KF_ERF_IMPL(T) \\
static inline T __attribute__((overloadable)) kf_erf(T x) { \\
    T a = fabs(x); \\
    T t = 1.0f / (1.0f + 0.3275911f * a); \\
    T y = 1.0f - (((((1.061405429f * t - 1.453152027f) * t) + 1.421413741f) * t - 0.284496736f) * t \\
                  + 0.254829592f) * t * exp(-a * a); \\
    return copysign(y, x); \\
}
KF_ERF_IMPL(float)
#ifdef VW
KF_ERF_IMPL(floatv)
#endif
"""


#: kf_keep(i, seed, p): 1 with probability 1 - p, from a 32-bit counter hash of (i, seed) (dropout's mask).
_KEEP = """{q} int kf_keep(kf_long i, int seed, float p) {{
    unsigned int h = ((unsigned int)i * 0x9E3779B1u) ^ ((unsigned int)(i >> 32) * 0x85EBCA77u)
        ^ ((unsigned int)seed * 0xC2B2AE3Du);
    h ^= h >> 16; h *= 0x7FEB352Du; h ^= h >> 15; h *= 0x846CA68Bu; h ^= h >> 16;
    return (float)(h >> 8) * (1.0f / 16777216.0f) >= p;
}}
"""


#: Math helpers, as ``KF_HELPER(Q, T)`` bodies over the language's macros (:data:`_LANG_MACROS`): ``KF_EXP``,
#: ``KF_ABS``, ``KF_FMA``, ``KF_COPYSIGN``, ``KF_FDIV`` (a quotient within 2 ulps: CUDA's ``__fdividef`` where
#: the divisor stays below 2^126), ``KF_EX2`` / ``KF_RCP`` (CUDA: ``ex2.approx.ftz`` / ``rcp.approx.ftz``,
#: one MUFU instruction each, within 2 ulps / 1 ulp; OpenCL: ``exp2`` and a division) and ``KF_SPLIT(T, x, j,
#: s)`` (j = rint(x / ln 2) and s = 2^(j - 1): CUDA in three instructions, a magic-number rounding whose low
#: mantissa bits shifted into the exponent are s; OpenCL ``rint`` and ``ldexp``). Constants are cast to T,
#: since OpenCL's vector ``fma`` takes no scalar.
#:
#: ``kf_expm1``: one path, no select: u clamped to [-30, 88.75] (NaN kept: expm1 is -1 below -17.4 and
#: overflows above 88.73), u = j ln2 + r with |r| <= ln2 / 2 (Cody-Waite, ln2 in two parts), expm1(r) = r +
#: r^2 (1/2 + r Q(r)) with Q a degree-3 minimax fit (relative error 1.4e-8), and expm1(u) = 2 (s p + (s -
#: 1/2)) with s = 2^(j - 1), so that j = 128 does not overflow before the last product (-0 gives +0).
#: About 17 instructions (a Taylor series beside expf and a select take 22); within 1.6 ulps.
#: ``kf_tanh``: below |u| = 0.55 an odd minimax polynomial a + a^3 P(a^2), a = |u| (degree 3 in a^2,
#: relative error 3.7e-8); above, 1 - 2 / (2^(2a log2 e) + 1) (no cancellation past tanh = 1/2; the
#: exponential's error is damped by 2e / (e + 1)^2 <= 0.38); either with the sign of u (-0 kept). About
#: 14 instructions, branch-free, within 2 ulps on CUDA (the structure of CUDA 11+'s tanhf). ``kf_rcp``:
#: the reciprocal of a normal divisor (sigmoid's 1 + exp(-x), scaled) in one MUFU.RCP on CUDA.
#: ``kf_mish``: tanh(log1p(e)) = n / (n + 2), n = e (e + 2), e = exp(a) (past a = 20 the ratio is 1 in
#: fp32; a = -inf gives -inf * 0 = NaN, as torch). All keep NaN and +-inf.
#: ``kf_softplus``: log1p(exp(u)) in one piece (softplus, log-sigmoid, the logistic losses): max(u, 0) +
#: log1p(t), t = exp(-|u|) in (0, 1], log1p(t) = 2 atanh(s) = 2s + s^3 P(s^2) with s = t / (2 + t) in
#: [0, 1/3] (P a degree-3 minimax fit, relative error 5e-9; 2 + t in [2, 3] so the reciprocal is one
#: MUFU.RCP on CUDA). About 20 instructions, branch-free, where expf and log1pf take ~45 and a branch;
#: within 3.5 ulps of float64 (0.45 RMS) where torch's float32 log1p(exp(u)) is within 1-2.
MATH_HELPERS = {
    "kf_expm1": """Q T kf_expm1(T u) { \\
    T x = u < -30.0f ? (T)(-30.0f) : u; \\
    x = x > 88.75f ? (T)(88.75f) : x; \\
    KF_SPLIT(T, x, j, s) \\
    T r = KF_FMA(j, (T)(-0.693145751953125f), x); \\
    r = KF_FMA(j, (T)(-1.42860677e-06f), r); \\
    T h = KF_FMA(KF_FMA(KF_FMA((T)(0.00138982409f), r, (T)(0.00836611446f)), r, (T)(0.0416668542f)), r, \\
                 (T)(0.16666548f)); \\
    T p = KF_FMA(KF_FMA(h, r, (T)(0.5f)), r * r, r); \\
    return 2.0f * KF_FMA(s, p, s - 0.5f); \\
}""",
    "kf_tanh": """Q T kf_tanh(T u) { \\
    T a = KF_ABS(u); \\
    T big = KF_FMA(KF_RCP(KF_EX2(a * 2.88539004f) + 1.0f), (T)(-2.0f), (T)(1.0f)); \\
    T v = u * u; \\
    T q = KF_FMA(KF_FMA(KF_FMA((T)(0.0164375659f), v, (T)(-0.052671805f)), v, (T)(0.133207247f)), v, \\
                 (T)(-0.333329469f)); \\
    return KF_COPYSIGN(a >= 0.55f ? big : KF_FMA(v * q, a, a), u); \\
}""",
    "kf_rcp": """Q T kf_rcp(T d) { return KF_RCP(d); }""",
    "kf_softplus": """Q T kf_softplus(T u) { \\
    T t = KF_EXP(-KF_ABS(u)); \\
    T s = t * KF_RCP(t + 2.0f); \\
    T w = s * s; \\
    T p = KF_FMA(KF_FMA(KF_FMA((T)(0.28027058f), w, (T)(0.27998662f)), w, (T)(0.40021726f)), w, \\
                 (T)(0.66666412f)); \\
    return (u > 0.0f ? u : (T)(0.0f)) + KF_FMA(s * w, p, 2.0f * s); \\
}""",
    "kf_mish": """Q T kf_mish(T a) { \\
    T e = KF_EXP(a); T n = e * (e + 2.0f); \\
    return a > 20.0f ? a : a * KF_FDIV(n, n + 2.0f); \\
}""",
}

#: Per language, the macros the helper bodies use. CUDA's KF_SPLIT: 12583038 = 1.5 * 2^23 + 126, so that
#: fma(x, log2 e, 12583038) rounds x / ln2 to the integer j in its last mantissa bits, whose low 9 bits are
#: j + 126 (j in [-44, 128]): 2^(j - 1)'s exponent field once shifted by 23.
_LANG_MACROS: dict[str, dict[str, str]] = {
    "cuda": {
        "KF_EXP": "expf",
        "KF_ABS": "fabsf",
        "KF_FDIV": "__fdividef",
        "KF_FMA": "fmaf",
        "KF_COPYSIGN": "copysignf",
        "KF_EX2": "kf_ex2_approx",
        "KF_RCP": "kf_rcp_approx",
        "KF_SPLIT(T, x, j, s)": "const T kf_m = fmaf(x, 1.44269502f, 12583038.0f); const T j = kf_m - 12583038.0f; "
        "const T s = __uint_as_float(__float_as_uint(kf_m) << 23);",
    },
    "opencl": {
        "KF_EXP": "exp",
        "KF_ABS": "fabs",
        "KF_FDIV": "KF_QUOT",
        "KF_QUOT(a, b)": "((a) / (b))",
        "KF_FMA": "fma",
        "KF_COPYSIGN": "copysign",
        "KF_EX2": "exp2",
        "KF_RCP(d)": "(1.0f / (d))",
        "KF_SPLIT(T, x, j, s)": "const T j = rint((x) * 1.44269502f); const T s = kf_exp2m1i(j);",
    },
}

#: What the macros call: CUDA's MUFU instructions (PTX approx, flush-to-zero), OpenCL's 2^(j - 1).
_SUPPORT = {
    "cuda": """#ifndef KF_MUFU_DEFINED
#define KF_MUFU_DEFINED
static __device__ __forceinline__ float kf_ex2_approx(float x) {
#ifdef __CUDA_ARCH__
    float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
#else  // host compilers (the tests' CPU emulation of the CUDA kernels)
    return exp2f(x);
#endif
}
static __device__ __forceinline__ float kf_rcp_approx(float x) {
#ifdef __CUDA_ARCH__
    float y; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
#else
    return 1.0f / x;
#endif
}
#endif
""",
    "opencl": """#ifndef KF_EXP2M1I_DEFINED
#define KF_EXP2M1I_DEFINED
static inline __attribute__((overloadable)) float kf_exp2m1i(float j) { return ldexp(0.5f, (int)j); }
#ifdef VW
#if VW == 2
#define KF_CONVERT_INTV convert_int2
#elif VW == 4
#define KF_CONVERT_INTV convert_int4
#else
#define KF_CONVERT_INTV convert_int8
#endif
static inline __attribute__((overloadable)) floatv kf_exp2m1i(floatv j) {
    return ldexp((floatv)(0.5f), KF_CONVERT_INTV(j));
}
#endif
#endif
""",
}

#: The helpers' (qualifiers, type) instances; OpenCL's vector one where VW is defined.
_INSTANCES = {
    "cuda": ["static __device__ __forceinline__, float"],
    "opencl": ["static inline __attribute__((overloadable)), float"],
}


def helper_source(name: str, lang: str) -> str:
    """The definition of math helper ``name`` (:data:`MATH_HELPERS`) in ``lang``, guarded against a repeat
    (its support code first, guarded too)."""
    guard = f"{name.upper()}_DEFINED"
    macros = _LANG_MACROS[lang]
    out = f"#ifndef {guard}\n#define {guard}\n#define KF_HELPER(Q, T) \\\n{MATH_HELPERS[name]}\n"
    out += "".join(f"#define {k} {v}\n" for k, v in macros.items())
    out += "".join(f"KF_HELPER({q})\n" for q in _INSTANCES[lang])
    if lang == "opencl":
        out += "#ifdef VW\nKF_HELPER(static inline __attribute__((overloadable)), floatv)\n#endif\n"
    out += "#undef KF_HELPER\n" + "".join(f"#undef {k.split('(')[0]}\n" for k in macros) + "#endif\n"
    # the macros are the helpers' own (KFH_*): defining and undefining them leaves a kernel's KF_FMA alone
    names = "|".join(k.split("(")[0] for k in [*macros, "KF_HELPER"])
    return _SUPPORT[lang] + re.sub(rf"\b({names})\b", lambda m: "KFH_" + m.group(1)[3:], out)


def prelude(expr: str, lang: str) -> str:
    """Helper definitions an expression needs (empty when none)."""
    out = OPENCL_MATH_PRELUDE if lang == "opencl" and "kf_erf" in expr else ""
    for name in MATH_HELPERS:
        if f"{name}(" in expr:
            out += helper_source(name, lang)
    if "kf_keep(" in expr:
        out += _KEEP.format(q="__device__ __forceinline__" if lang == "cuda" else "")
    return out


def fn(name: str, lang: str) -> str:
    """A math function's name in ``lang`` (``expf`` on CUDA, ``exp`` on OpenCL, ``kf_erf`` for OpenCL erf)."""
    if lang == "opencl" and name == "erf":
        return "kf_erf"
    if name == "expm1":
        return "kf_expm1"
    if lang == "cuda" and name in _MATH:
        return "rsqrtf" if name == "rsqrt" else f"{name}f"
    return name


def lit(value: float) -> str:
    """A float literal both languages accept."""
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    return f"{float(value)!r}f".replace("inff", "INFINITY")


def _at_least(a: str, lo: str) -> str:
    """max(a, lo) that keeps a NaN ``a`` (as torch's clamp does; fmax would return ``lo``)."""
    return f"(({a}) < {lo} ? {lo} : ({a}))"


def _at_most(a: str, hi: str) -> str:
    """min(a, hi) that keeps a NaN ``a``."""
    return f"(({a}) > {hi} ? {hi} : ({a}))"


def _clamp(a: str, lo: float, hi: float) -> str:
    out = a if math.isinf(lo) else _at_least(a, lit(lo))
    return out if math.isinf(hi) else _at_most(out, lit(hi))


#: 1/6 in float32 (hardsigmoid, hardswish)
_SIXTH = float(np.float32(1.0 / 6.0))


def _unary(name: str, a: str, lang: str, **kw: Any) -> str:
    f = lambda n: fn(n, lang)  # noqa: E731
    # NaN in, NaN out, as torch: no fmax/fmin (they drop a NaN operand); ?: selects per lane on OpenCL vectors
    neg_exp = f"{lit(kw.get('alpha', 1.0))} * {f('expm1')}({a})"
    table: dict[str, Callable[[], str]] = {
        "relu": lambda: _at_least(a, "0.0f"),
        "sigmoid": lambda: f"(1.0f / (1.0f + {f('exp')}(-({a}))))",
        "tanh": lambda: f"{f('tanh')}({a})",
        # torch's vectorised CPU GELU returns NaN at +-inf; the OpenCL (CPU) kernels do the same: (a - a)
        "gelu": lambda: (
            f"(0.5f * ({a}) * (1.0f + {f('erf')}(({a}) * 0.7071067811865476f))"
            + (f" + (({a}) - ({a})))" if lang == "opencl" else ")")
        ),
        # 0.5 * a * (1 + tanh(u)) = a * sigmoid(2u): one exp, no tanhf and no powf
        "gelu_tanh": lambda: (
            f"(({a}) / (1.0f + {f('exp')}(-1.5957691216057308f * (({a}) + 0.044715f * ({a}) * ({a}) * ({a})))))"
        ),
        "silu": lambda: f"(({a}) / (1.0f + {f('exp')}(-({a}))))",
        "mish": lambda: f"kf_mish({a})",
        # branch-free forms (so a chain can run in vector arithmetic): equal to torch's up to rounding
        "softplus": lambda: f"kf_softplus({a})",
        "exp": lambda: f"{f('exp')}({a})",
        "log": lambda: f"{f('log')}({a})",
        "abs": lambda: f"{f('fabs')}({a})",
        "sqrt": lambda: f"{f('sqrt')}({a})",
        "rsqrt": lambda: f"{f('rsqrt')}({a})",
        "sin": lambda: f"{f('sin')}({a})",
        "cos": lambda: f"{f('cos')}({a})",
        "neg": lambda: f"(-({a}))",
        "square": lambda: f"(({a}) * ({a}))",
        "softsign": lambda: f"(({a}) / (1.0f + {f('fabs')}({a})))",
        "hardsigmoid": lambda: _clamp(f"({a}) * {lit(_SIXTH)} + 0.5f", 0.0, 1.0),
        "hardswish": lambda: f"(({a}) * {_clamp(f'({a}) + 3.0f', 0.0, 6.0)} * {lit(_SIXTH)})",
        "leaky_relu": lambda: f"(({a}) < 0.0f ? {lit(kw.get('slope', 0.01))} * ({a}) : ({a}))",
        "elu": lambda: f"(({a}) < 0.0f ? {neg_exp} : ({a}))",
        "selu": lambda: (
            f"(1.0507009873554805f * (({a}) < 0.0f ? 1.6732632423543772f * {f('expm1')}({a}) : ({a})))"
        ),
        "clamp": lambda: _clamp(a, kw.get("lo", -math.inf), kw.get("hi", math.inf)),
        "erf": lambda: f"{f('erf')}({a})",
        "relu6": lambda: _clamp(a, 0.0, 6.0),
        "logsigmoid": lambda: f"(-kf_softplus(-({a})))",
        "reciprocal": lambda: f"(1.0f / ({a}))",
        "log2": lambda: f"{f('log2')}({a})",
        "log10": lambda: f"{f('log10')}({a})",
        "exp2": lambda: f"{f('exp2')}({a})",
        "expm1": lambda: f"{f('expm1')}({a})",
        "log1p": lambda: f"{f('log1p')}({a})",
        "floor": lambda: f"{f('floor')}({a})",
        "ceil": lambda: f"{f('ceil')}({a})",
        "tan": lambda: f"{f('tan')}({a})",
    }
    if name not in table:
        raise GeneratorUnsupported(f"offline generator: elementwise op {name!r} is not in the cookbook")
    return table[name]()


def _exp_argument(node: Any) -> Any:
    """The argument of ``node`` where ``node`` is ``torch.exp(v)`` or ``v.exp()``; None otherwise."""
    if not isinstance(node, fx.Node) or not node.args:
        return None
    if (node.op == "call_function" and node.target is torch.exp) or (
        node.op == "call_method" and node.target == "exp"
    ):
        return node.args[0]
    return None


_FUNCS: dict[Any, str] = {
    torch.erf: "erf",
    F.relu6: "relu6",
    F.logsigmoid: "logsigmoid",
    torch.reciprocal: "reciprocal",
    torch.log2: "log2",
    torch.log10: "log10",
    torch.exp2: "exp2",
    torch.expm1: "expm1",
    torch.log1p: "log1p",
    torch.floor: "floor",
    torch.ceil: "ceil",
    torch.tan: "tan",
    torch.relu: "relu",
    F.relu: "relu",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    torch.tanh: "tanh",
    F.tanh: "tanh",
    F.gelu: "gelu",
    F.silu: "silu",
    F.mish: "mish",
    F.softplus: "softplus",
    torch.exp: "exp",
    torch.log: "log",
    torch.abs: "abs",
    torch.sqrt: "sqrt",
    torch.rsqrt: "rsqrt",
    torch.sin: "sin",
    torch.cos: "cos",
    torch.neg: "neg",
    operator.neg: "neg",
    torch.square: "square",
    F.softsign: "softsign",
    F.hardsigmoid: "hardsigmoid",
    F.hardswish: "hardswish",
    F.leaky_relu: "leaky_relu",
    F.elu: "elu",
    F.selu: "selu",
    torch.selu: "selu",
    torch.clamp: "clamp",
    F.hardtanh: "clamp",
    torch.clip: "clamp",
}
_METHODS = {
    "erf",
    "reciprocal",
    "log2",
    "log10",
    "exp2",
    "expm1",
    "log1p",
    "floor",
    "ceil",
    "tan",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "abs",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "neg",
    "square",
    "clamp",
}
_MODULES: dict[type, str] = {
    nn.ReLU6: "relu6",
    nn.LogSigmoid: "logsigmoid",
    nn.ReLU: "relu",
    nn.Sigmoid: "sigmoid",
    nn.Tanh: "tanh",
    nn.GELU: "gelu",
    nn.SiLU: "silu",
    nn.Mish: "mish",
    nn.Softplus: "softplus",
    nn.Softsign: "softsign",
    nn.Hardsigmoid: "hardsigmoid",
    nn.Hardswish: "hardswish",
    nn.LeakyReLU: "leaky_relu",
    nn.ELU: "elu",
    nn.SELU: "selu",
    nn.Hardtanh: "clamp",
    nn.Identity: "identity",
}
_BINARY: dict[Any, str] = {
    operator.add: "+",
    torch.add: "+",
    operator.sub: "-",
    torch.sub: "-",
    operator.mul: "*",
    torch.mul: "*",
    operator.truediv: "/",
    torch.div: "/",
    torch.true_divide: "/",
    torch.multiply: "*",
    torch.subtract: "-",
    torch.divide: "/",
}
_BINARY_METHODS = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "multiply": "*",
    "subtract": "-",
    "divide": "/",
    "true_divide": "/",
}


def reciprocal_literal(c: float) -> float | None:
    """``1 / c`` rounded to float32 where ``x / c`` may become ``x * (1 / c)``: c finite and non-zero and
    its reciprocal a normal float32 (no overflow or flush); exact where c is a power of two, else within
    one ulp of the quotient (an FMUL in place of CUDA's IEEE division, ~20 instructions)."""
    if not math.isfinite(c) or c == 0.0:
        return None
    r = 1.0 / c
    if not 2.0**-126 <= abs(r) <= 2.0**126:
        return None
    return float(np.float32(r))


def _binary(op: str, a: Any, b: Any, operand: Callable[[Any], str]) -> str:
    """``a op b``; a division by a Python number is a multiplication by its reciprocal, and one by a float
    argument of the kernel (a count ``forward`` computes: a mean's divisor) a multiplication by the
    argument's reciprocal, which the compiler computes once (within 1.5 ulps of the quotient)."""
    if op == "/" and isinstance(b, int | float) and not isinstance(b, bool):
        r = reciprocal_literal(float(b))
        if r is not None:
            return f"({operand(a)} * {lit(r)})"
    left, right = operand(a), operand(b)
    if op == "/" and re.fullmatch(r"f\d+", right):
        return f"({left} * (1.0f / {right}))"
    return f"({left} {op} {right})"


def _kwargs(name: str, node: Any, module: Any = None) -> dict[str, Any]:
    """Scalar options of parameterised activations."""
    kw = dict(node.kwargs)
    args = list(node.args[1:])
    if module is not None:
        if name == "leaky_relu":
            return {"slope": module.negative_slope}
        if name == "elu":
            return {"alpha": module.alpha}
        if name == "clamp":
            return {"lo": module.min_val, "hi": module.max_val}
        if name == "softplus" and (module.beta != 1 or module.threshold != 20):
            raise GeneratorUnsupported(
                "offline generator: softplus with beta/threshold is not in the cookbook"
            )
        if name == "gelu" and module.approximate == "tanh":
            return {"tanh": True}
        return {}
    if name == "leaky_relu":
        return {"slope": kw.get("negative_slope", args[0] if args else 0.01)}
    if name == "elu":
        return {"alpha": kw.get("alpha", args[0] if args else 1.0)}
    if name == "clamp":
        lo = kw.get(
            "min", kw.get("min_val", args[0] if args else -1.0 if node.target is F.hardtanh else None)
        )
        hi = kw.get(
            "max", kw.get("max_val", args[1] if len(args) > 1 else 1.0 if node.target is F.hardtanh else None)
        )
        return {"lo": -math.inf if lo is None else float(lo), "hi": math.inf if hi is None else float(hi)}
    if name == "gelu" and kw.get("approximate", "none") == "tanh":
        return {"tanh": True}
    return {}


_COMPARE = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!=", "greater": ">", "less": "<"}


def _condition(c: Any, operand: Callable[[Any], str]) -> str:
    """``c`` as a C condition: a comparison node's own comparison (not its 1.0f/0.0f value compared with
    0), else ``c != 0``."""
    if hasattr(c, "op") and _name_of(c) in _COMPARE and len(c.args) == 2:
        return f"(({operand(c.args[0])}) {_COMPARE[_name_of(c)]} ({operand(c.args[1])}))"
    return f"(({operand(c)}) != 0.0f)"


def _is_compare(c: Any, name: str, x: Any, value: float) -> bool:
    return (
        hasattr(c, "op")
        and _name_of(c) == name
        and len(c.args) == 2
        and c.args[0] is x
        and isinstance(c.args[1], int | float)
        and c.args[1] == value
    )


def _sign_of(node: Any) -> Any:
    """x where ``node`` is torch.sign's composition ``where(x > 0, 1, where(x < 0, -1, 0))``
    (:mod:`.normalize_forms`; 0 for NaN and +-0, as torch), else None."""
    c, one, inner = node.args
    if not (hasattr(c, "op") and c.args and hasattr(inner, "op") and _name_of(inner) == "where"):
        return None
    x, values = c.args[0], (one, *inner.args[1:])
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return None
    exclusive = _is_compare(c, "gt", x, 0.0) and _is_compare(inner.args[0], "lt", x, 0.0)
    return x if exclusive and values == (1.0, -1.0, 0.0) else None


def _balanced_from(text: str, i: int) -> int:
    """The index just past the parenthesised group that opens at ``text[i] == "("`` (-1 if unbalanced)."""
    depth = 0
    for k in range(i, len(text)):
        depth += {"(": 1, ")": -1}.get(text[k], 0)
        if depth == 0:
            return k + 1
    return -1


def exact_forms(expr: str, lang: str) -> str:
    """``expr`` with the compositions that have a one-instruction equal written as it: torch.trunc's ``x < 0
    ? ceil(x) : floor(x)`` (:mod:`.normalize_forms`, exact for every x, -0 and NaN too) as ``truncf(x)`` /
    ``trunc(x)`` (one FRND.TRUNC where the select takes three). Kernel text only: the Triton form reads
    the plain expression."""
    ceil, floor, trunc = ("ceilf", "floorf", "truncf") if lang == "cuda" else ("ceil", "floor", "trunc")
    out, pos = [], 0
    while True:
        k = expr.find(f"? ({ceil}(", pos)
        if k < 0:
            break
        g0 = k + len(f"? ({ceil}")
        g1 = _balanced_from(expr, g0)
        group = expr[g0:g1] if g1 > 0 else ""  # "(x)": where(lt(x, 0), ceil(x), floor(x)) as written
        head = f"((({group[1:-1]}) < (0.0f)) "
        tail = f"? ({ceil}{group}) : ({floor}{group}))"
        if group and expr.startswith(tail, k) and expr[pos:k].endswith(head):
            start = k - len(head)
            out.append(expr[pos:start] + f"{trunc}{group}")
            pos = k + len(tail)
        else:
            out.append(expr[pos : k + 1])
            pos = k + 1
    return "".join(out) + expr[pos:]


def _name_of(node: Any) -> str:
    """The bare name of a call_function/call_method target (``gt`` for operator.gt, torch.gt, x.gt)."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return str(getattr(node.target, "__name__", ""))
    return ""


def node_expr(node: Any, gm: Any, operand: Callable[[Any], str], lang: str) -> str | None:
    """The C expression of an elementwise fx node, or None if the node is not elementwise."""
    target = node.target
    name: str | None = None
    module = None
    if node.op == "call_module":
        module = gm.get_submodule(target)
        name = _MODULES.get(type(module))
        if name is None:
            return None
    elif node.op == "call_function" and target in _BINARY:
        a, b = node.args[0], node.args[1]
        if node.kwargs.get("alpha", 1) != 1 or node.kwargs.get("rounding_mode"):
            raise GeneratorUnsupported(
                "offline generator: add/div with alpha or rounding is not in the cookbook"
            )
        return _binary(_BINARY[target], a, b, operand)
    elif _name_of(node) in _COMPARE and len(node.args) == 2:
        return f"({_condition(node, operand)} ? 1.0f : 0.0f)"
    elif _name_of(node) == "where" and len(node.args) == 3:
        sign = _sign_of(node)
        if sign is not None:  # where(x > 0, 1, where(x < 0, -1, 0)): two 1.0/0.0 values (FSET), one FADD
            x = operand(sign)
            return f"(((({x}) > (0.0f)) ? 1.0f : 0.0f) - ((({x}) < (0.0f)) ? 1.0f : 0.0f))"
        a, b = operand(node.args[1]), operand(node.args[2])
        return f"({_condition(node.args[0], operand)} ? ({a}) : ({b}))"
    elif (
        _name_of(node) in ("maximum", "minimum", "max", "min", "fmax", "fmin")
        and len(node.args) == 2
        and all(hasattr(x, "op") or isinstance(x, int | float) for x in node.args)
        and any(hasattr(x, "op") for x in node.args[1:])
    ):
        a, b = operand(node.args[0]), operand(node.args[1])
        cmp = ">" if _name_of(node) in ("maximum", "max", "fmax") else "<"
        if _name_of(node).startswith("f"):  # fmax/fmin ignore a NaN operand
            return f"({fn(_name_of(node), lang)}({a}, {b}))"
        return f"((({a}) {cmp} ({b}) || ({a}) != ({a})) ? ({a}) : ({b}))"  # NaN in either operand: NaN
    elif node.op == "call_method" and target in _BINARY_METHODS:
        return _binary(_BINARY_METHODS[target], node.args[0], node.args[1], operand)
    elif (node.op == "call_function" and target in (operator.pow, torch.pow)) or (
        node.op == "call_method" and target == "pow"
    ):
        base, exp = node.args[0], node.args[1]
        if not isinstance(exp, int | float):
            return None
        a = operand(base)
        if (
            float(exp).is_integer() and 1 <= abs(exp) <= 4
        ):  # repeated products, not powf (exact for NaN/inf too)
            prod = " * ".join([f"({a})"] * int(abs(exp)))
            return f"({prod})" if exp > 0 else f"(1.0f / ({prod}))"
        if exp == 0.5:
            return f"{fn('sqrt', lang)}({a})"
        return f"{fn('pow', lang)}({a}, {lit(exp)})"
    elif node.op == "call_function":
        name = _FUNCS.get(target)
    elif node.op == "call_method" and target in _METHODS:
        name = target
    if name is None:
        return None
    inner = _exp_argument(node.args[0]) if name == "log1p" else None
    if inner is not None:  # log1p(exp(v)): softplus(v), one helper (the exp is left to any other users)
        return f"kf_softplus({operand(inner)})"
    a = operand(node.args[0])
    if name == "identity":
        return a
    kw = _kwargs(name, node, module)
    if name == "gelu" and kw.get("tanh"):
        name = "gelu_tanh"
    return _unary(name, a, lang, **kw)
