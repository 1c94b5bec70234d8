"""Row operations over data viewed as [outer, R, inner], reduced along R, as C snippets.

Each family is a small algebra of running statistics: ``init`` values, ``acc`` (fold one element
``x`` in), ``merge`` (fold another thread's statistics, suffixed ``_o``, in), ``final`` (derived
values) and ``out`` (the output element from ``x`` and its position ``j`` in the row). Softmax keeps
a running maximum with a rescaled running sum (online softmax); layer norm uses Welford's update.
The naive recipe uses :meth:`RowOp.multipass` instead: one separate loop over the row per statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfoundry.plugins.llms.offline.elementwise_ops import fn, lit
from kfoundry.plugins.llms.offline.recognize import OpSpec


@dataclass
class RowOp:
    stats: list[tuple[str, str]]
    acc: str
    merge: str
    final: str
    out: str
    #: Reduction families write one value per row.
    reduce: bool = False
    result: str = ""
    #: Folds the float4 ``q`` in at once ("" where four ``acc`` steps are as cheap): softmax rescales its
    #: sum once per four elements, Welford divides once per four.
    fold4: str = ""

    def declare(self, suffix: str = "") -> str:
        return " ".join(f"float {n}{suffix} = {init};" for n, init in self.stats)

    @property
    def acc4(self) -> str:
        """A statement folding the float4 ``q`` in."""
        if self.fold4:
            return self.fold4
        return (
            f"{{ float x; x = q.x; {self.acc} x = q.y; {self.acc} x = q.z; {self.acc} x = q.w; {self.acc} }}"
        )


def row_op(spec: OpSpec, lang: str) -> RowOp:
    f = lambda name: fn(name, lang)  # noqa: E731
    R = "(float)R"
    eps = lit(spec.eps)
    if spec.family in ("softmax", "log_softmax"):
        # NaN and infinities as torch's two-pass softmax: a max that does not move rescales by exactly 1
        # (no exp(inf - inf)), a -inf element adds 0 (no exp(-inf - -inf)); +inf and NaN make the row NaN.
        acc = (
            f"{{ float m_new = {f('fmax')}(running_max, x); "
            f"running_sum = running_sum * (running_max == m_new ? 1.0f : {f('exp')}(running_max - m_new)) "
            f"+ (x == -INFINITY ? 0.0f : {f('exp')}(x - m_new)); running_max = m_new; }}"
        )
        merge = (
            f"{{ float m_new = {f('fmax')}(running_max, running_max_o); "
            f"running_sum = running_sum * (running_max == m_new ? 1.0f : {f('exp')}(running_max - m_new)) "
            f"+ running_sum_o * (running_max_o == m_new ? 1.0f : {f('exp')}(running_max_o - m_new)); "
            "running_max = m_new; }"
        )
        # four elements: one new maximum, one rescale of the sum, four exponentials
        mx = f("fmax")
        terms = " + ".join(f"(q.{c} == -INFINITY ? 0.0f : {f('exp')}(q.{c} - m_new))" for c in "xyzw")
        fold4 = (
            f"{{ float m_new = {mx}(running_max, {mx}({mx}(q.x, q.y), {mx}(q.z, q.w))); "
            f"running_sum = running_sum * (running_max == m_new ? 1.0f : {f('exp')}(running_max - m_new)) "
            f"+ (({terms})); running_max = m_new; }}"
        )
        stats = [("running_max", "-INFINITY"), ("running_sum", "0.0f")]
        if spec.family == "softmax":
            return RowOp(
                stats,
                acc,
                merge,
                "float inv_sum = 1.0f / running_sum;",
                f"({f('exp')}(x - running_max) * inv_sum)",
                fold4=fold4,
            )
        return RowOp(
            stats, acc, merge, f"float lse = running_max + {f('log')}(running_sum);", "(x - lse)", fold4=fold4
        )
    if spec.family == "layer_norm":
        out = "((x - welford_mean) * rstd)"
        if spec.affine:
            out = f"({out} * w[j] + b[j])" if lang == "opencl" else f"fmaf({out}, w[j], b[j])"
        # four elements: their own mean and squared deviations, merged in with one division
        fold4 = (
            "{ float m4 = ((q.x + q.y) + (q.z + q.w)) * 0.25f; float ax = q.x - m4, ay = q.y - m4, "
            "az = q.z - m4, aw = q.w - m4; float s4 = (ax * ax + ay * ay) + (az * az + aw * aw); "
            "float nt = welford_n + 4.0f; float d = m4 - welford_mean; float k = 4.0f / nt; "
            "welford_mean += d * k; welford_m2 += s4 + d * d * (welford_n * k); welford_n = nt; }"
        )
        return RowOp(
            [("welford_n", "0.0f"), ("welford_mean", "0.0f"), ("welford_m2", "0.0f")],
            "{ welford_n += 1.0f; float d = x - welford_mean; welford_mean += d / welford_n; "
            "welford_m2 += d * (x - welford_mean); }",
            "if (welford_n_o > 0.0f) { float nt = welford_n + welford_n_o; float d = welford_mean_o - welford_mean; "
            "welford_mean += d * (welford_n_o / nt); welford_m2 += welford_m2_o + d * d * (welford_n * welford_n_o / nt); "
            "welford_n = nt; }",
            f"float rstd = {f('rsqrt')}(welford_m2 / {R} + {eps});",
            out,
            fold4=fold4,
        )
    if spec.family == "rms_norm":
        acc = "sumsq += x * x;" if lang == "opencl" else "sumsq = fmaf(x, x, sumsq);"
        return RowOp(
            [("sumsq", "0.0f")],
            acc,
            "sumsq += sumsq_o;",
            f"float rstd = {f('rsqrt')}(sumsq / {R} + {eps});",
            "(x * rstd)",
        )
    op = spec.reduce_op
    if op in ("sum", "mean"):
        result = f"(total / {R})" if op == "mean" else "total"
        return RowOp([("total", "0.0f")], "total += x;", "total += total_o;", "", "", True, result)
    if op == "prod":
        return RowOp([("total", "1.0f")], "total *= x;", "total *= total_o;", "", "", True, "total")
    # torch.amax/amin propagate NaN (fmax/fmin would drop it): a NaN, once taken, is never replaced
    if op == "max":
        return RowOp(
            [("total", "-INFINITY")],
            "total = (x > total || x != x) ? x : total;",
            "total = (total_o > total || total_o != total_o) ? total_o : total;",
            "",
            "",
            True,
            "total",
        )
    if op == "min":
        return RowOp(
            [("total", "INFINITY")],
            "total = (x < total || x != x) ? x : total;",
            "total = (total_o < total || total_o != total_o) ? total_o : total;",
            "",
            "",
            True,
            "total",
        )
    raise ValueError(f"no row algebra for {spec.family}/{op}")


def multipass(spec: OpSpec, lang: str, load: str) -> tuple[str, str]:
    """(statements, output expression) of the naive recipe: one loop over the row per statistic.

    ``load`` is a format string giving the element at row position ``{r}``.
    """
    f = lambda name: fn(name, lang)  # noqa: E731
    x = load.format(r="r")
    R = "(float)R"
    if spec.family in ("softmax", "log_softmax"):
        stmts = (
            f"float mx = -INFINITY;\n    for (int r = 0; r < R; ++r) mx = {f('fmax')}(mx, {x});\n"
            f"    float s = 0.0f;\n    for (int r = 0; r < R; ++r) s += {f('exp')}({x} - mx);\n"
        )
        out = f"{f('exp')}(x - mx) / s" if spec.family == "softmax" else f"x - mx - {f('log')}(s)"
        return stmts, out
    if spec.family == "layer_norm":
        stmts = (
            f"float mean = 0.0f;\n    for (int r = 0; r < R; ++r) mean += {x};\n    mean /= {R};\n"
            f"    float var = 0.0f;\n    for (int r = 0; r < R; ++r) var += ({x} - mean) * ({x} - mean);\n"
            f"    var /= {R};\n"
        )
        out = f"(x - mean) / {f('sqrt')}(var + {lit(spec.eps)})"
        return stmts, (f"{out} * w[j] + b[j]" if spec.affine else out)
    if spec.family == "rms_norm":
        stmts = f"float ss = 0.0f;\n    for (int r = 0; r < R; ++r) ss += {x} * {x};\n"
        return stmts, f"x / {f('sqrt')}(ss / {R} + {lit(spec.eps)})"
    op = row_op(spec, lang)
    stmts = f"{op.declare()}\n    for (int r = 0; r < R; ++r) {{ float x = {x}; {op.acc} }}\n"
    return stmts, op.result
