"""Triton row recipes: data viewed as ``[outer, R, inner]``, reduced over ``R``, a program per row.

Ladder: one pass over the row per statistic -> single-pass online statistics (a running maximum with
a rescaled running sum; Welford's update per lane, merged by the parallel-variance formula) -> the
whole row cached in registers (one read, one write), where it fits. Reductions (sum, mean, max, min)
keep a block of partial results; max and min propagate NaN as torch does.
"""

from __future__ import annotations

import textwrap

from kfoundry.core.generator import GeneratorUnsupported
from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec
from kfoundry.plugins.llms.offline.triton_recipes import WARPS, make_recipe

NEG_INF = 'float("-inf")'
#: Widest row kept whole in registers by the cached recipe.
MAX_CACHED = 16384


def _dims(spec: OpSpec) -> str:
    """Python lines computing ``outer, R, inner`` (the ``[outer, R, inner]`` view) and ``y`` from ``x``."""
    d = spec.dim
    if spec.family == "layer_norm":
        sizes = f"outer, R, inner = _prod(x.shape[:{d}]), _prod(x.shape[{d}:]), 1"
    else:
        sizes = f"outer, R, inner = _prod(x.shape[:{d}]), x.shape[{d}], _prod(x.shape[{d + 1}:])"
    if spec.family != "reduce":
        return f"{sizes}\ny = torch.empty_like(x)"
    keep = " + (1,)" if len(spec.output_shape) == len(spec.input_shapes[0]) else ""
    return (
        f"{sizes}\ny = torch.empty(x.shape[:{d}]{keep} + x.shape[{d + 1}:], dtype=x.dtype, device=x.device)"
    )


def _row_forward(spec: OpSpec) -> str:
    wb = "self.m0.weight, self.m0.bias, " if spec.affine else ""
    return f"""
x = x.contiguous()
{_dims(spec)}
rows[(outer * inner,)](x, {wb}y, R, inner, BLOCK_SIZE=p["BLOCK_SIZE"], num_warps=p["num_warps"])
return y
"""


_LOOP = "for start in range(0, R, BLOCK_SIZE):\n    m = start + cols < R\n"


def _load(other: str, target: str = "x") -> str:
    return f"    {target} = tl.load(X + base + (start + cols) * inner, mask=m, other={other})\n"


def _cache(other: str) -> str:
    """The whole row loaded once into registers (``row_cache``), read as ``x``."""
    return _load(other, "row_cache").strip() + "\nx = row_cache\n"


def _out(spec: OpSpec) -> str:
    """The output block from ``x`` (and the row statistics); ``w``/``b`` at the row positions."""
    eps = repr(float(spec.eps))
    fam = spec.family
    if fam == "softmax":
        return "tl.exp(x - row_max) / row_sum"
    if fam == "log_softmax":
        return "x - row_max - tl.log(row_sum)"
    if fam == "layer_norm":
        y = f"(x - row_mean) * tl.rsqrt(row_var + {eps})"
        return (
            f"{y} * tl.load(W + start + cols, mask=m) + tl.load(B + start + cols, mask=m)"
            if spec.affine
            else y
        )
    return f"x / tl.sqrt(sumsq / R + {eps})"


def _write(spec: OpSpec) -> str:
    return _LOOP + _load("0.0") + f"    tl.store(Y + base + (start + cols) * inner, {_out(spec)}, mask=m)\n"


def _reduce_result(op: str, acc: str, nan: str) -> str:
    if op in ("sum", "mean"):
        total = f"tl.sum({acc}, axis=0)"
        return f"{total} / R" if op == "mean" else total
    pick = "tl.max" if op == "max" else "tl.min"
    # torch.amax/amin propagate NaN; the block reductions would drop it
    return f'tl.where(tl.max({nan}.to(tl.int32), axis=0) > 0, float("nan"), {pick}({acc}, axis=0))'


def _reduce_body(spec: OpSpec, cached: bool) -> str:
    op = spec.reduce_op
    if op not in ("sum", "mean", "max", "min"):
        raise GeneratorUnsupported(f"offline generator: no Triton recipe for the reduction {op!r}")
    other = "0.0" if op in ("sum", "mean") else (NEG_INF if op == "max" else 'float("inf")')
    fold = {"max": "tl.maximum(acc, x)", "min": "tl.minimum(acc, x)"}.get(op, "acc + x")
    if cached:
        body = "start = 0\nm = cols < R\n" + _cache(other) + "nan = x != x\n"
        return body + f"tl.store(Y + g, {_reduce_result(op, 'x', 'nan')})\n"
    init = f"acc = tl.full([BLOCK_SIZE], {other}, tl.float32)\nnan = tl.zeros([BLOCK_SIZE], tl.int1)\n"
    loop = _LOOP + _load(other) + f"    acc = {fold}\n    nan = nan | (x != x)\n"
    return init + loop + f"tl.store(Y + g, {_reduce_result(op, 'acc', 'nan')})\n"


def _stats(spec: OpSpec, how: str) -> str:
    """Statements computing the row statistics ``_out`` reads: ``multipass``, ``online`` or ``cached``."""
    fam = spec.family
    if fam in ("softmax", "log_softmax"):
        if how == "multipass":
            return (
                f"mx = tl.full([BLOCK_SIZE], {NEG_INF}, tl.float32)\n"
                + _LOOP
                + _load(NEG_INF)
                + "    mx = tl.maximum(mx, x)\nrow_max = tl.max(mx, axis=0)\n"
                + "acc = tl.zeros([BLOCK_SIZE], tl.float32)\n"
                + _LOOP
                + _load(NEG_INF)
                + "    acc += tl.where(m, tl.exp(x - row_max), 0.0)\nrow_sum = tl.sum(acc, axis=0)\n"
            )
        # online: per lane a running maximum and a running sum rescaled when the maximum moves
        return (
            f"running_max = tl.full([BLOCK_SIZE], {NEG_INF}, tl.float32)\n"
            "running_sum = tl.zeros([BLOCK_SIZE], tl.float32)\n"
            + _LOOP
            + _load(NEG_INF)
            + "    m_new = tl.maximum(running_max, x)\n"
            "    running_sum = running_sum * tl.where(running_max == m_new, 1.0, tl.exp(running_max - m_new))"
            f" + tl.where(x == {NEG_INF}, 0.0, tl.exp(x - m_new))\n"
            "    running_max = m_new\n"
            "row_max = tl.max(running_max, axis=0)\n"
            "row_sum = tl.sum(tl.where(running_max == row_max, running_sum,"
            " running_sum * tl.exp(running_max - row_max)), axis=0)\n"
        )
    if fam == "layer_norm":
        if how == "multipass":
            return (
                "acc = tl.zeros([BLOCK_SIZE], tl.float32)\n"
                + _LOOP
                + _load("0.0")
                + "    acc += x\nrow_mean = tl.sum(acc, axis=0) / R\n"
                + "acc = tl.zeros([BLOCK_SIZE], tl.float32)\n"
                + _LOOP
                + _load("0.0")
                + "    d = tl.where(m, x - row_mean, 0.0)\n    acc += d * d\n"
                + "row_var = tl.sum(acc, axis=0) / R\n"
            )
        # online: Welford's update per lane, the lanes merged by the parallel-variance formula
        return (
            "welford_n = tl.zeros([BLOCK_SIZE], tl.float32)\nwelford_mean = tl.zeros([BLOCK_SIZE], tl.float32)\n"
            "welford_m2 = tl.zeros([BLOCK_SIZE], tl.float32)\n"
            + _LOOP
            + _load("0.0")
            + "    welford_n += tl.where(m, 1.0, 0.0)\n    d = tl.where(m, x - welford_mean, 0.0)\n"
            "    welford_mean += d / tl.maximum(welford_n, 1.0)\n    welford_m2 += tl.where(m, d * (x - welford_mean), 0.0)\n"
            "row_mean = tl.sum(welford_n * welford_mean, axis=0) / R\n"
            "dm = welford_mean - row_mean\n"
            "row_var = (tl.sum(welford_m2, axis=0) + tl.sum(welford_n * dm * dm, axis=0)) / R\n"
        )
    return (
        "acc = tl.zeros([BLOCK_SIZE], tl.float32)\n"
        + _LOOP
        + _load("0.0")
        + "    acc += x * x\nsumsq = tl.sum(acc, axis=0)\n"
    )


def _cached_body(spec: OpSpec) -> str:
    """The whole row in registers: one read, statistics from the block, one write."""
    fam = spec.family
    eps = repr(float(spec.eps))
    head = "start = 0\nm = cols < R\n"
    if fam in ("softmax", "log_softmax"):
        body = (
            _cache(NEG_INF) + "row_max = tl.max(x, axis=0)\n"
            "e = tl.where(m, tl.exp(x - row_max), 0.0)\nrow_sum = tl.sum(e, axis=0)\n"
        )
        out = "e / row_sum" if fam == "softmax" else "x - row_max - tl.log(row_sum)"
    elif fam == "layer_norm":
        body = (
            _cache("0.0") + "row_mean = tl.sum(x, axis=0) / R\n"
            "d = tl.where(m, x - row_mean, 0.0)\nrow_var = tl.sum(d * d, axis=0) / R\n"
        )
        out = f"d * tl.rsqrt(row_var + {eps})"
        if spec.affine:
            out = f"{out} * tl.load(W + cols, mask=m) + tl.load(B + cols, mask=m)"
    else:
        body = _cache("0.0") + "sumsq = tl.sum(x * x, axis=0)\n"
        out = f"x / tl.sqrt(sumsq / R + {eps})"
    return head + body + f"tl.store(Y + base + cols * inner, {out}, mask=m)\n"


def _kernel(spec: OpSpec, body: str) -> str:
    wb = "W, B, " if spec.affine else ""
    head = (
        f"@triton.jit\ndef rows(X, {wb}Y, R, inner, BLOCK_SIZE: tl.constexpr):\n"
        "    # one program per row of the [outer, R, inner] view\n"
        "    g = tl.program_id(0)\n    base = (g // inner) * R * inner + g % inner\n"
        "    cols = tl.arange(0, BLOCK_SIZE)\n"
    )
    return head + textwrap.indent(body, "    ")


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


def row_recipes(spec: OpSpec) -> list[Recipe]:
    fam = spec.family
    if fam == "layer_norm" and spec.affine and spec.inner != 1:
        raise GeneratorUnsupported("offline generator: no Triton recipe for an affine norm over strided rows")
    forward, args = _row_forward(spec), ["x"]
    looped = TunableSpace(params={"BLOCK_SIZE": [128, 256, 512, 1024, 2048, 4096], "num_warps": WARPS})
    loop_defaults = {"BLOCK_SIZE": min(1024, _pow2_at_least(spec.R)), "num_warps": 4}
    out: list[Recipe] = []
    if fam == "reduce":
        out.append(
            make_recipe(
                "triton/rows/block",
                fam,
                _kernel(spec, _reduce_body(spec, cached=False)),
                forward,
                args,
                looped,
                loop_defaults,
                0,
                "a program per row, a block of partial results",
                modules=spec.modules,
            )
        )
    else:
        out.append(
            make_recipe(
                "triton/rows/multipass",
                fam,
                _kernel(spec, _stats(spec, "multipass") + _write(spec)),
                forward,
                args,
                looped,
                loop_defaults,
                0,
                "a program per row, one pass per statistic",
                modules=spec.modules,
            )
        )
        if fam != "rms_norm":
            out.append(
                make_recipe(
                    "triton/rows/online",
                    fam,
                    _kernel(spec, _stats(spec, "online") + _write(spec)),
                    forward,
                    args,
                    looped,
                    loop_defaults,
                    1,
                    "single-pass online statistics, then the write pass",
                    modules=spec.modules,
                )
            )
    if spec.R <= MAX_CACHED:
        width = _pow2_at_least(spec.R)
        widths = [width, 2 * width] if 2 * width <= MAX_CACHED else [width]
        cached = TunableSpace(
            params={"BLOCK_SIZE": widths, "num_warps": WARPS}, restrictions=[f"BLOCK_SIZE >= {spec.R}"]
        )
        body = _reduce_body(spec, cached=True) if fam == "reduce" else _cached_body(spec)
        out.append(
            make_recipe(
                "triton/rows/cached",
                fam,
                _kernel(spec, body),
                forward,
                args,
                cached,
                {"BLOCK_SIZE": width, "num_warps": 4 if width <= 2048 else 8},
                2,
                "the whole row cached in registers: one read, one write",
                modules=spec.modules,
            )
        )
    return out
