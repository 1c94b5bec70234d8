"""Mean and variance of long normalisation rows as a parallel split reduction (the fused schedules).

Batch, instance and group norm (and layer norm over trailing dims) reduce rows made of ``outer``
contiguous runs of ``inner`` elements, ``mid * inner`` apart (batch norm: ``outer`` = N, a run is one
image's channel; instance and group norm: one run per row). Each run is cut into pieces of
:data:`PIECE` elements; a work-group reads a piece (128-bit loads where the run's length allows), sums
``x - shift`` and its square (``shift`` the piece's first element: no cancellation when the mean is far
from zero) in a local-memory tree and publishes the piece's (mean, M2). A work-group per row merges its
pieces (Chan et al., a fixed order: deterministic) into the row's mean and variance. :func:`normalise`
then writes the output over the same pieces (mean and 1/std loaded once per work-group, no division per
element but the group norm channel's, one per float4), last piece first; where rows are one run each
and short enough for L2, ``lower_norm_stream`` does all of it in one kernel that reads x once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline import lower_norm_stream
from kfoundry.plugins.llms.offline.elementwise_ops import fn, lit
from kfoundry.plugins.llms.offline.lower import Val, decompose, horner

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering

#: Elements of one run that a work-group reduces.
PIECE = 4096


def _layout(nd: int, row_dims: list[int]) -> tuple[int, bool] | None:
    """(start of the trailing run dims, whether dim 0 is a row dim outside them), or None where the
    row is not made of contiguous runs that way."""
    rows = set(row_dims)
    s = min(k for k in range(nd + 1) if set(range(k, nd)) <= rows)
    head = rows - set(range(s, nd))
    if s == nd or head not in (set(), {0}):
        return None
    return s, head == {0}


def _pair_sum(lang: str) -> str:
    """A work-group's ``s1`` and ``s2`` summed (a fixed order) into ``a`` and ``q`` of item 0, through
    ``kf_r1`` / ``kf_r2``: on CUDA warp shuffles, then item 0 adds the warps' sums (one barrier); on
    OpenCL a local-memory tree."""
    if lang == "cuda":
        return """    s1 = kf_wsum(s1);
    s2 = kf_wsum(s2);
    if ((t & 31) == 0) { kf_r1[t >> 5] = s1; kf_r2[t >> 5] = s2; }
    KF_BARRIER;
    float a = 0.0f, q = 0.0f;
    if (t == 0) for (int w = 0; w < BLOCK / 32; ++w) { a += kf_r1[w]; q += kf_r2[w]; }"""
    return """    kf_r1[t] = s1;
    kf_r2[t] = s2;
    KF_BARRIER;
    for (int o = BLOCK / 2; o > 0; o >>= 1) {
        if (t < o) { kf_r1[t] += kf_r1[t + o]; kf_r2[t] += kf_r2[t + o]; }
        KF_BARRIER;
    }
    const float a = kf_r1[0], q = kf_r2[0];"""


def _stats_kernels(
    L: Lowering, node: fx.Node, src: Val, row_dims: list[int]
) -> tuple[str, dict[str, str]] | None:
    """The split statistics of ``src``'s rows: a kernel whose work-groups reduce pieces into (mean,
    M2) partials, then a work-group per row merging them (Chan) into (mean, M2 / count). Returns the
    buffer of (mean, variance) pairs per row and the layout's C names, or None (not a buffer of runs)."""
    nd = len(src.shape)
    lay = _layout(nd, row_dims)
    if not L.fuse or src.buffer is None or lay is None:
        return None
    s, batch = lay
    n = L.order[node]
    S = src.py_shape
    outer_py = f"{S}[0]" if batch else "1"
    mid_py = f"_prod({S}[1:{s}])" if batch else f"_prod({S}[:{s}])"
    L.fwd(
        f"Q{n} = ({outer_py}, {mid_py}, _prod({S}[{s}:]), {outer_py} * _cdiv(_prod({S}[{s}:]), {PIECE}), "
        f"int(_prod({S}[{s}:]) % 4 == 0 and {src.buffer}.data_ptr() % 16 == 0))"
    )
    outer, mid, inner, pp, vec = (L.sym(f"Q{n}[{k}]") for k in range(5))
    xp = L.ptr(src.buffer)
    if L.lang == "opencl":
        v4 = "const float4 v = vload4(i, p);"
    else:
        v4 = "const float4 v = reinterpret_cast<const float4*>(p)[i];"
    where = f"""    const kf_long row = blk / {pp}, piece = blk - row * {pp};
    const kf_long per = ((kf_long){inner} + {PIECE - 1}) / {PIECE};
    const kf_long b = piece / per, c0 = (piece - b * per) * {PIECE};
    const kf_long left = (kf_long){inner} - c0;
    const int len = (int)(left < {PIECE} ? left : {PIECE});
    const kf_long base = (b * {mid} + row) * {inner} + c0;"""
    # a piece's sums are shifted by its first element (no cancellation when the mean is far from zero,
    # the spread within a piece being what is summed), then turned into its (mean, M2)
    text = f"""    KF_LOCAL float kf_r1[BLOCK];
    KF_LOCAL float kf_r2[BLOCK];
    const int t = KF_LID(0);
    const kf_long blk = KF_GRP(0);
{where}
    KF_G const float* p = {xp} + base;
    const float shift = p[0];
    float s1 = 0.0f, s2 = 0.0f;
    if ({vec}) {{
        #pragma unroll 4
        for (int i = t; i < len / 4; i += BLOCK) {{  // a piece is 4 float4 per thread at BLOCK 256: in flight together
            {v4}
            const float d0 = v.x - shift, d1 = v.y - shift, d2 = v.z - shift, d3 = v.w - shift;
            s1 += (d0 + d1) + (d2 + d3);
            s2 += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
        }}
    }} else {{
        for (int i = t; i < len; i += BLOCK) {{ const float d = p[i] - shift; s1 += d; s2 += d * d; }}
    }}
{_pair_sum(L.lang)}
    if (t == 0) {{
        const float m2 = q - a * (a / (float)len);
        y[2 * blk] = shift + a / (float)len;
        y[2 * blk + 1] = m2 > 0.0f ? m2 : 0.0f;
    }}"""
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty(2 * Q{n}[1] * Q{n}[3], dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, Q{n}[1] * Q{n}[3]), 1, 1), block=(p['BLOCK'], 1, 1)"
    parts = L.ptr(L.kernel(text, "float", "", "stats", launch_dims=launch))
    L.fwd(L.sched.kernels[-1].launch)
    # a work-group per row merges its pieces' (count, mean, M2) in a fixed order (Chan et al.)
    merge = lower_norm_stream.CHAN_MERGE
    text = f"""    KF_LOCAL float kf_n[BLOCK];
    KF_LOCAL float kf_m[BLOCK];
    KF_LOCAL float kf_q[BLOCK];
    const int t = KF_LID(0);
    const kf_long row = KF_GRP(0);
    const kf_long per = ((kf_long){inner} + {PIECE - 1}) / {PIECE};
    float na = 0.0f, ma = 0.0f, qa = 0.0f;
    for (kf_long i = t; i < {pp}; i += BLOCK) {{
        const kf_long c0 = (i - (i / per) * per) * {PIECE}, left = (kf_long){inner} - c0;
        const float nb = (float)(left < {PIECE} ? left : {PIECE});
        const float mb = {parts}[2 * (row * {pp} + i)], qb = {parts}[2 * (row * {pp} + i) + 1];
        {merge.format(na="na", nb="nb", ma="ma", mb="mb", qa="qa", qb="qb")}
    }}
    {lower_norm_stream.chan_tree(("kf_n", "kf_m", "kf_q"), "    ")}
    if (t == 0) {{ const float v = kf_q[0] / kf_n[0]; y[2 * row] = kf_m[0]; y[2 * row + 1] = v > 0.0f ? v : 0.0f; }}"""
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty(2 * Q{n}[1], dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, Q{n}[1]), 1, 1), block=(p['BLOCK'], 1, 1)"
    st = L.ptr(L.kernel(text, "float", "", "fold", launch_dims=launch))
    L.fwd(L.sched.kernels[-1].launch)
    del outer
    return st, {
        "mid": mid,
        "inner": inner,
        "pp": pp,
        "vec": vec,
        "where": where,
        "n": str(n),
        "first": "1" if batch else "0",
        "s": str(s),
    }


def row_stats(L: Lowering, node: fx.Node, src: Val, row_dims: list[int]) -> tuple[Val, Val] | None:
    """(mean, biased variance) of ``src`` over ``row_dims``, each of the kept shape (ones at the row
    dims), or None where ``src`` is not a buffer or its rows are not runs (the caller's path then)."""
    got = _stats_kernels(L, node, src, row_dims)
    if got is None:
        return None
    st, lay = got
    S = src.py_shape
    n, first, s = lay["n"], int(lay["first"]), int(lay["s"])
    kept = tuple(1 if k in row_dims else v for k, v in enumerate(src.shape))
    L.fwd(f"S{n}st = tuple(1 if k in {tuple(row_dims)!r} else v for k, v in enumerate({S}))")

    def pick(c: list[str], k: int) -> str:
        row = horner(c[first:s], src.dims[first:s]) if s > first else "0"
        return f"float acc = {st}[2 * ({row}) + {k}];"

    mu = L.emit_pointwise(kept, f"S{n}st", lambda c: pick(c, 0), "mean")
    var = L.emit_pointwise(kept, f"S{n}st", lambda c: pick(c, 1), "var")
    return mu, var


def normalise(
    L: Lowering,
    node: fx.Node,
    src: Val,
    row_dims: list[int],
    eps: float,
    weight: str | None,
    bias: str | None,
    aff: tuple[Callable[[str], str], str | None],
    tag: str,
) -> Val | None:
    """``src`` normalised over ``row_dims`` (its rows made of runs, see :func:`_layout`) in three
    kernels: the split statistics, a work-group per row merging them, then work-groups over the same
    pieces (128-bit loads and stores, the row's mean and 1/std loaded once per work-group, the pieces
    taken last first: those the statistics read last are still in L2). ``aff`` = (the affine
    parameters' index of a row's first element, as C of the row; None or the positions per parameter
    step within a run: "1" each element its own, else a divisor). None where the layout does not fit."""
    base_fn, step = aff
    divided = step is not None and step != "1" and (weight is not None or bias is not None)

    def param(q: str, k: int | None) -> str:
        if step is None:
            return "kf_pb"
        if step == "1":
            return f"(kf_pb + {q})"
        if k is not None:  # a float4's channels: the first's, or the next from the boundary on (step >= 4)
            return f"(kf_pb + kf_ch + (kf_q0 + {k}u >= kf_nx))"
        return f"(kf_pb + (kf_long)((unsigned)({q}) / (unsigned)({step})))"

    def one(v: str, q: str, k: int | None = None) -> str:
        e = f"(({v}) - kf_mean) * kf_rstd"
        if weight is not None:
            e = f"({e} * {weight}[{param(q, k)}])"
        if bias is not None:
            e = f"({e} + {bias}[{param(q, k)}])"
        return e

    lay0 = _layout(len(src.shape), row_dims)
    if lay0 is not None and not lay0[1] and src.buffer is not None and L.fuse:
        inner_n = math.prod(src.shape[lay0[0] :])
        if lower_norm_stream.wanted(L, inner_n):  # one kernel, the second read from L2
            return lower_norm_stream.stream_normalise(
                L, node, src, lay0[0], eps, weight, bias, param, base_fn, step if divided else None, tag
            )
    got = _stats_kernels(L, node, src, row_dims)
    if got is None:
        return None
    st, lay = got
    f = lambda name: fn(name, L.lang)  # noqa: E731
    mid, pp, vec, where = lay["mid"], lay["pp"], lay["vec"], lay["where"]
    xp = L.ptr(src.buffer or "")
    if L.lang == "opencl":
        v4 = "const float4 v = vload4(i, p);"
    else:
        v4 = "const float4 v = reinterpret_cast<const float4*>(p)[i];"
    outs = ", ".join(one(f"v.{c}", f"c0 + 4 * i + {k}", k) for k, c in enumerate("xyzw"))
    chq = (
        f"const unsigned kf_q0 = (unsigned)(c0 + 4 * i), kf_ch = kf_q0 / (unsigned)({step}), "
        f"kf_nx = (kf_ch + 1u) * (unsigned)({step}); "
        if divided
        else ""
    )
    vec = f"{vec} && (unsigned)({step}) >= 4u" if divided else vec
    fast = lower_norm_stream.uniform(weight, bias, param, step if divided else None)
    prep, body4 = "", f"{v4} {chq}KF_STORE4(o, 4 * i, {outs});"
    if fast is not None:  # a piece within one channel: one multiply-add an element
        sc, of, uni = fast
        fouts = ", ".join(f"(v.{c} - kf_mean) * kf_sc + kf_of" for c in "xyzw")
        if uni == "1":
            prep = f"\n    const float kf_sc = {sc}, kf_of = {of};"
            body4 = f"{v4} KF_STORE4(o, 4 * i, {fouts});"
        else:
            prep = f"\n    const int kf_uni = {uni};\n    const float kf_sc = kf_uni ? {sc} : 0.0f, kf_of = kf_uni ? {of} : 0.0f;"
            body4 = (
                f"{v4} if (kf_uni) KF_STORE4(o, 4 * i, {fouts}); else {{ {chq}KF_STORE4(o, 4 * i, {outs}); }}"
            )
    text = f"""    const int t = KF_LID(0);
    const kf_long blk = (kf_long){mid} * {pp} - 1 - KF_GRP(0);  // last piece first
{where}
    const kf_long kf_pb = {base_fn("row")}; (void)kf_pb;
    const float kf_mean = {st}[2 * row], kf_rstd = {f("rsqrt")}({st}[2 * row + 1] + {lit(eps)});
    KF_G const float* p = {xp} + base;
    KF_G float* o = y + base;{prep}
    if ({vec}) {{
        #pragma unroll 4
        for (int i = t; i < len / 4; i += BLOCK) {{ {body4} }}
    }} else {{
        for (int i = t; i < len; i += BLOCK) o[i] = {one("p[i]", "c0 + i")};
    }}"""
    n = lay["n"]
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty({src.py_shape}, dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, Q{n}[1] * Q{n}[3]), 1, 1), block=(p['BLOCK'], 1, 1)"
    name = L.kernel(text, "float", "", tag, launch_dims=launch)
    L.fwd(L.sched.kernels[-1].launch)
    return L.buffer_val(name, src.shape, src.py_shape)


#: Elements of one output's contiguous run that a work-group of the block reduction folds.
RUN_PIECE = 16384

_COMBINE = {
    "add": ("0.0f", "{a} += {b};"),
    "max": ("-INFINITY", "{a} = ({b} > {a} || {b} != {b}) ? {b} : {a};"),
    "min": ("INFINITY", "{a} = ({b} < {a} || {b} != {b}) ? {b} : {a};"),
}


def block_reduce(
    L: Lowering,
    node: fx.Node | None,
    src: Val,
    op: str,
    p: float,
    tag: str,
    out: tuple[int, ...],
    dims: list[int],
    divide_by: str,
) -> Val | None:
    """sum / mean / max / min / L1 and L2 norm of a buffer over its trailing dims (each output one
    contiguous run) in two kernels: work-groups fold pieces of :data:`RUN_PIECE` elements (128-bit loads,
    four in flight per work item, a local-memory tree), then a work-group per output folds its pieces
    the same way and applies the epilogue. None where ``src`` is not such a buffer (the caller's path)."""
    nd = len(src.shape)
    if src.buffer is None or not dims or dims != list(range(nd - len(dims), nd)):
        return None
    if op not in ("sum", "mean", "max", "min") and not (op == "norm" and p in (1.0, 2.0)):
        return None
    f = lambda name: fn(name, L.lang)  # noqa: E731
    kind = op if op in ("max", "min") else "add"
    init, comb = _COMBINE[kind]
    term = {"norm": (lambda v: f"({v}) * ({v})") if p == 2.0 else (lambda v: f"{f('fabs')}({v})")}.get(
        op, lambda v: v
    )
    S = src.py_shape
    s = nd - len(dims)
    L.fwd(
        f"T{tag} = (_prod({S}[:{s}]), _prod({S}[{s}:]), _cdiv(_prod({S}[{s}:]), {RUN_PIECE}), "
        f"int(_prod({S}[{s}:]) % 4 == 0 and {src.buffer}.data_ptr() % 16 == 0))"
    )
    outs, run, pp, vec = (L.sym(f"T{tag}[{k}]") for k in range(4))
    xp = L.ptr(src.buffer)
    v4 = (
        "const float4 v = vload4(i, p);"
        if L.lang == "opencl"
        else "const float4 v = reinterpret_cast<const float4*>(p)[i];"
    )
    fold4 = " ".join(comb.format(a="s", b=f"({term(f'v.{c}')})") for c in "xyzw")
    tree = f"""    kf_r[t] = s;
    KF_BARRIER;
    for (int o = BLOCK / 2; o > 0; o >>= 1) {{
        if (t < o) {{ {comb.format(a="kf_r[t]", b="kf_r[t + o]")} }}
        KF_BARRIER;
    }}"""
    text = f"""    KF_LOCAL float kf_r[BLOCK];
    const int t = KF_LID(0);
    const kf_long blk = KF_GRP(0), row = blk / {pp}, c0 = (blk - row * {pp}) * {RUN_PIECE};
    const kf_long left = (kf_long){run} - c0;
    const int len = (int)(left < {RUN_PIECE} ? left : {RUN_PIECE});
    KF_G const float* p = {xp} + row * (kf_long){run} + c0;
    float s = {init};
    if ({vec}) {{
        #pragma unroll 4
        for (int i = t; i < len / 4; i += BLOCK) {{ {v4} {fold4} }}
    }} else {{
        for (int i = t; i < len; i += BLOCK) {{ const float v = p[i]; {comb.format(a="s", b=f"({term('v')})")} }}
    }}
{tree}
    if (t == 0) y[blk] = kf_r[0];"""
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty(T{tag}[0] * T{tag}[2], dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, T{tag}[0] * T{tag}[2]), 1, 1), block=(p['BLOCK'], 1, 1)"
    parts = L.ptr(L.kernel(text, "float", "", f"{op}piece", launch_dims=launch))
    L.fwd(L.sched.kernels[-1].launch)
    odims = L.shape_dims(f"S{tag}", out)
    coords = [f"c{k}" for k in range(len(out))]
    store, ctype, _ = L.epilogue(node, out, coords, "float")
    decomp = decompose("row", odims, coords, outs) if out else ""
    fin = ""
    if op == "mean":
        fin += f" acc = acc / (float)({run});"
    if op == "norm" and p == 2.0:
        fin += f" acc = {f('sqrt')}(acc);"
    if divide_by:
        fin += f" acc = acc / (float)({divide_by});"
    text = f"""    KF_LOCAL float kf_r[BLOCK];
    const int t = KF_LID(0);
    const kf_long row = KF_GRP(0);
    float s = {init};
    for (kf_long i = t; i < {pp}; i += BLOCK) {{ const float v = {parts}[row * {pp} + i]; {comb.format(a="s", b="v")} }}
{tree}
    if (t == 0) {{
{decomp}        float acc = kf_r[0];{fin}
        y[row] = {store};
    }}"""
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty(S{tag}, dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, T{tag}[0]), 1, 1), block=(p['BLOCK'], 1, 1)"
    name = L.kernel(text, ctype, "", op, launch_dims=launch)
    L.fwd(L.sched.kernels[-1].launch)
    return L.buffer_val(name, out, f"S{tag}", ctype)
