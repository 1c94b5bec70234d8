"""Pooling of the lowering (max / average, 1-D to 3-D, adaptive average).

Where the window (kernel size, stride, padding, dilation) is known when the graph is traced (the
module's or the call's ints), the kernel is specialised to it behind a run-time check that the
arguments still hold those values (else a generic loop serves any window):

* a work item is one output column ``ow`` of ``R`` consecutive output rows (``R`` = 4 where the
  windows overlap along the rows, else 1); its coordinates are decomposed once (32-bit where the
  item count fits), the ``(n, c)`` plane's base offset is formed once in 64 bits, offsets inside the
  plane are 32-bit (a plane is part of one sample: :mod:`.index_width` widens them where that does
  not fit);
* consecutive work items are consecutive ``ow``: a warp's loads of one tap are adjacent (coalesced);
* the window is unrolled with compile-time strides: each input row of the ``R`` outputs' span is
  reduced across the row's taps once and folded into every output whose window holds it (a row
  shared by overlapping windows is read once per item, not once per output);
* items whose span lies inside the input take a branch-free path; the rest (borders, padding,
  ceil-mode windows past the end, a ragged last group of rows) mask each tap;
* where the input is a 16-byte aligned buffer (checked when called) a vector path serves instead:
  an item is 4 adjacent output columns (one float4) of ``R`` rows (and ``DEPTH`` depths of a 3-D
  window overlapping there); each input row of its span is read as the aligned float4 chunks that hold
  a tap, masked per chunk (rows whole float4s: a chunk is wholly in or out of its row) or, for rows that
  are not, the chunks aligned in memory and the row's span shifted out of them at run time (two
  selects per float, a mask per column); one body serves borders and padding (no divergent border
  path); stores are float4 where output rows are a multiple of 4 long;
* max propagates NaN as torch does (``max.NaN.f32`` on sm_80+; elsewhere ``v > a || v != v``),
  padding is -inf for max; average divides by torch's count (``count_include_pad``) or
  ``divisor_override``.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, Any

import torch.fx as fx
import torch.nn as nn

from kfoundry.plugins.llms.offline import lower_ops as ops
from kfoundry.plugins.llms.offline.elementwise_ops import lit
from kfoundry.plugins.llms.offline.lower import Val, _shape, decompose, unflat

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering

#: Output rows per work item where the windows overlap along the rows (each shared row read once).
ROWS = 4
#: Output columns per work item where 1-D windows overlap (each shared tap loaded once, the index
#: arithmetic once: a window of 8 at stride 1 loads 11 values for 4 outputs, not 32)
COLS = 4
#: Output rows per vector-path item along a 3-D window's depth where the windows overlap there.
DEPTH = 2
#: Adjacent outputs per work item along the innermost dim on the vector path (one float4).
VEC = 4
#: Most floats of one input row's span (its float4 chunks) the vector path holds at once.
MAX_VEC_SPAN = 64
#: Largest window (taps) unrolled by the specialised kernel.
MAX_TAPS = 512

#: NaN-propagating max of a float accumulator (one instruction on sm_80+).
PMAX = {
    "cuda": (
        "#ifndef KF_PMAX\n"
        "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n"
        '#define KF_PMAX(a, v) asm("max.NaN.f32 %0, %0, %1;" : "+f"(a) : "f"(v))\n'
        "#else\n"
        "#define KF_PMAX(a, v) (a) = ((v) > (a) || (v) != (v)) ? (v) : (a)\n"
        "#endif\n"
        "#endif\n"
    ),
    "opencl": "#ifndef KF_PMAX\n#define KF_PMAX(a, v) (a) = ((v) > (a) || (v) != (v)) ? (v) : (a)\n#endif\n",
}


def _window(L: Lowering, sizes: list[str]) -> tuple[str, list[str]]:
    """Nested loop headers over a window of ``sizes`` (int counters, no index division) and their names."""
    names = [L.fresh("w") for _ in sizes]
    return " ".join(f"for (int {w} = 0; {w} < {k}; ++{w})" for w, k in zip(names, sizes, strict=True)), names


def _ints(v: Any, nd: int) -> tuple[int, ...] | None:
    """``v`` as ``nd`` ints (an int is repeated) where it is known now, else None."""
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd
    if len(t) != nd or not all(isinstance(k, int) and not isinstance(k, bool) for k in t):
        return None
    return t


def static_window(k: Any, s: Any, p: Any, d: Any, nd: int) -> tuple[tuple[int, ...], ...] | None:
    """(kernel, stride, padding, dilation) as int tuples where all are known now and fit the unrolled kernel."""
    kk = _ints(k, nd)
    ss = _ints(s if s else k, nd)
    pp, dd = _ints(p, nd), _ints(d, nd)
    if kk is None or ss is None or pp is None or dd is None:
        return None
    if min(kk) < 1 or min(ss) < 1 or min(dd) < 1 or min(pp) < 0:
        return None
    taps = 1
    for v in kk:
        taps *= v
    return (kk, ss, pp, dd) if taps <= MAX_TAPS else None


def _pool(
    L: Lowering,
    node: fx.Node,
    kind: str,
    nd: int,
    k: str,
    s: str,
    p: str,
    d: str,
    ceil: bool,
    include_pad: bool = True,
    divisor: int | None = None,
    static: tuple[tuple[int, ...], ...] | None = None,
) -> Val:
    x = L.tensor(ops._args(node)[0])
    n = L.order[node]
    L.fwd(f"S{n} = _poolshape({x.py_shape}, {nd}, {k}, {s}, {p}, {d}, {ceil})")
    out = _shape(node)
    kk = [L.sym(f"_nt({k}, {nd})[{i}]") for i in range(nd)]
    ss = [L.sym(f"_nt({s} if {s} else {k}, {nd})[{i}]") for i in range(nd)]
    pp = [L.sym(f"_nt({p}, {nd})[{i}]") for i in range(nd)]
    dd = [L.sym(f"_nt({d}, {nd})[{i}]") for i in range(nd)]
    lead = len(out) - nd
    idims = x.dims[lead:]

    def divisor_of(oc: list[str], ks: list[str], sts: list[str], pds: list[str]) -> str:
        """torch's divisor: the window clipped to the padded input (or to the input without padding)."""
        if divisor:
            return lit(float(divisor))
        lo = [f"(({oc[i]}) * {sts[i]} - {pds[i]})" for i in range(nd)]
        hi_pad = [
            f"({lo[i]} + {ks[i]} < {idims[i]} + {pds[i]} ? {lo[i]} + {ks[i]} : {idims[i]} + {pds[i]})"
            for i in range(nd)
        ]
        if include_pad:
            return " * ".join(f"(float)({hi_pad[i]} - {lo[i]})" for i in range(nd))
        return " * ".join(
            f"(float)(({hi_pad[i]} < {idims[i]} ? {hi_pad[i]} : {idims[i]}) - ({lo[i]} > 0 ? {lo[i]} : 0))"
            for i in range(nd)
        )

    def generic(c: list[str]) -> str:
        """One output per work item, any window (run-time sizes)."""
        oc = c[lead:]
        loops, wc = _window(L, kk)
        pos = [f"(({oc[i]}) * {ss[i]} - {pp[i]} + ({wc[i]}) * {dd[i]})" for i in range(nd)]
        inside = " && ".join(f"{q} >= 0 && {q} < {idims[i]}" for i, q in enumerate(pos))
        xl = x.load([*c[:lead], *pos])
        if kind == "max":
            return f"float acc = -INFINITY;\n        {loops} {{ if ({inside}) {{ float v = {xl}; KF_PMAX(acc, v); }} }}"
        div = divisor_of(oc, kk, ss, pp)
        return f"float acc = 0.0f;\n        {loops} {{ if ({inside}) acc += {xl}; }}\n        acc = acc / ({div});"

    dims = L.shape_dims(f"S{n}", out)
    coords = [f"c{i}" for i in range(len(out))]
    store, ctype, _ = L.epilogue(node, out, coords, "float")
    total = " * ".join(f"(kf_long){dm}" for dm in dims) or "1"
    head = PMAX.get(L.lang, PMAX["opencl"])
    text = (
        f"    const kf_long total = {total};\n"
        f"    for (kf_long g = KF_GID; g < total; g += KF_GSTRIDE) {{\n{decompose('g', dims, coords, 'total')}"
        f"        {generic(coords)}\n        y[g] = {store};\n    }}"
    )
    if static is not None and x.ctype == "float":
        fast = _specialised(L, node, kind, nd, x, out, dims, lead, static, divisor, divisor_of)
        if x.buffer is not None and vector_plan(static, nd) is not None:
            flag = L.sym(f"X{n}")
            L.fwd(f"X{n} = 0 if {x.buffer}.data_ptr() % 16 else 2 if {x.py_shape}[-1] % 4 == 0 else 1")
            clip = not divisor and (ceil or (not include_pad and any(static[2])))
            args = (L, node, kind, nd, x, out, dims, lead, static, divisor, divisor_of, clip)
            vec = _vectorised(*args)
            if shift_wanted(static):
                fast = f"    if ({flag} == 1) {{\n{_vectorised(*args, shifted=True)}\n    }} else {{\n{fast}\n    }}"
            fast = f"    if ({flag} == 2) {{\n{vec}\n    }} else {{\n{fast}\n    }}"
            head += VEC4.get(L.lang, VEC4["opencl"])
        match = " && ".join(
            f"{sym} == {v}"
            for syms, vals in zip((kk, ss, pp, dd), static, strict=True)
            for sym, v in zip(syms, vals, strict=True)
        )
        text = f"    if ({match}) {{\n{fast}\n    }} else {{\n{text}\n    }}"
    return L.finish(head + text, ctype, f"S{n}", out, f"{kind}pool", f"_prod(S{n})")


def _specialised(
    L: Lowering,
    node: fx.Node,
    kind: str,
    nd: int,
    x: Val,
    out: tuple[int, ...],
    odims: list[str],
    lead: int,
    static: tuple[tuple[int, ...], ...],
    divisor: int | None,
    divisor_of: Any,
) -> str:
    """The kernel body for the window ``static`` (see the module docstring)."""
    K, S, P, D = static
    idims = x.dims[lead:]
    od = odims[lead:]
    R = ROWS if nd >= 2 and (K[-2] - 1) * D[-2] + 1 > S[-2] else 1
    # 1-D only: 2-D and 3-D windows already share rows (R), and R x C accumulators cost registers
    C = COLS if nd == 1 and (K[-1] - 1) * D[-1] + 1 > S[-1] and K[-1] * COLS <= MAX_TAPS else 1
    # spatial item dims: ..., rows / R, columns / C
    ohb = f"(({od[-2]} + {R - 1}) / {R})" if nd >= 2 else ""
    owb = f"(({od[-1]} + {C - 1}) / {C})" if C > 1 else od[-1]
    item_sp = [*od[: nd - 2], ohb, owb] if nd >= 2 else [owb]
    planes = " * ".join(f"(kf_long){dm}" for dm in odims[:lead]) or "(kf_long)1"
    qn = [L.fresh("q") for _ in item_sp]
    qplane = L.fresh("qp")
    names = [qplane, *qn]
    items = f"{planes} * " + " * ".join(f"(kf_long){dm}" for dm in item_sp)
    dec = decompose("g", [f"({planes})", *item_sp], names, "items")
    # output coordinates of the item's first output; row j adds j to the row coordinate
    o = [f"(int){q}" for q in qn]
    if nd >= 2:
        o[-2] = f"((int){qn[-2]} * {R})"
    if C > 1:
        o[-1] = f"((int){qn[-1]} * {C})"
    ov = [L.fresh("o") for _ in range(nd)]
    lov = [L.fresh("lo") for _ in range(nd)]
    strides = [" * ".join(idims[i + 1 :]) or "1" for i in range(nd)]  # element strides inside a plane
    span = [(K[i] - 1) * D[i] + 1 for i in range(nd)]
    if nd >= 2:
        span[-2] += (R - 1) * S[-2]
    span[-1] += (C - 1) * S[-1]
    lines = [f"        const int {ov[i]} = {o[i]};" for i in range(nd)]
    lines += [f"        const int {lov[i]} = {ov[i]} * {S[i]} - {P[i]};" for i in range(nd)]
    psize = " * ".join(f"(kf_long){dm}" for dm in idims)
    if x.buffer is not None:  # a contiguous buffer: the plane's base once, taps at constant offsets
        lines.append(f"        const KF_G float* xb = {L.ptr(x.buffer)} + {qplane} * ({psize});")
    inside = [f"{lov[i]} >= 0 && {lov[i]} + {span[i] - 1} < {idims[i]}" for i in range(nd)]
    if R > 1:
        inside.append(f"{ov[-2]} + {R} <= {od[-2]}")
    if C > 1:
        inside.append(f"{ov[-1]} + {C} <= {od[-1]}")
    fill = "-INFINITY" if kind == "max" else "0.0f"
    accs = [[L.fresh("acc") for _ in range(C)] for _ in range(R)]
    pcoords = [L.fresh("pc") for _ in range(lead)]  # the output's leading coordinates (of the plane)

    def fold(a: str, v: str) -> str:
        return f"KF_PMAX({a}, {v});" if kind == "max" else f"{a} += {v};"

    def taps(masked: bool) -> str:
        """The unrolled window: per input row of the span, its taps reduced once, folded into its outputs."""
        out_l: list[str] = []
        outer = nd - 1  # dims before the last
        # every combination of the outer dims' span offsets (the row dim's span covers R outputs)
        combos: list[tuple[int, ...]] = [()]
        started: set[tuple[int, int]] = set()
        for i in range(outer):
            combos = [(*c, t) for c in combos for t in range(span[i])]
        for combo in combos:
            js = []
            for j in range(R):
                ok = True
                for i, t in enumerate(combo):
                    base = j * S[i] if (nd >= 2 and i == nd - 2) else 0
                    r = t - base
                    if r < 0 or r % D[i] or r // D[i] >= K[i]:
                        ok = False
                        break
                if ok:
                    js.append(j)
            if not js:
                continue
            off = " + ".join(
                [f"({lov[i]} + {t}) * {strides[i]}" for i, t in enumerate(combo)] + [f"{lov[-1]}"]
            )
            rv = L.fresh("r")
            hv = L.fresh("h")
            rowok = " && ".join(
                f"(unsigned)({lov[i]} + {t}) < (unsigned){idims[i]}" for i, t in enumerate(combo)
            )
            out_l.append(f"        {{ const KF_G float* {rv} = xb + ({off});" if x.buffer else "        {")
            if x.buffer and C > 1:  # the row's span loaded once, shared by the C outputs' windows
                taps_at = sorted({c * S[-1] + kw * D[-1] for c in range(C) for kw in range(K[-1])})
                loaded = {t: f"{rv}_{t}" for t in taps_at}
                for t in taps_at:
                    e = f"{rv}[{t}]"
                    if masked:
                        cond = f"(unsigned)({lov[-1]} + {t}) < (unsigned){idims[-1]}"
                        cond = f"{rowok} && {cond}" if rowok else cond
                        e = f"(({cond}) ? {e} : {fill})"
                    out_l.append(f"        const float {loaded[t]} = {e};")
            for c in range(C):
                vals = []
                for kw in range(K[-1]):
                    t = c * S[-1] + kw * D[-1]
                    if x.buffer and C > 1:
                        vals.append(loaded[t])
                        continue
                    if x.buffer:
                        e = f"{rv}[{t}]"
                    else:  # a loader (a view, an elementwise prologue): evaluated at the tap's coordinates
                        at = [f"(kf_long)({lov[i]} + {tt})" for i, tt in enumerate(combo)]
                        e = x.load([*pcoords, *at, f"(kf_long)({lov[-1]} + {t})"])
                    if masked:
                        cond = f"(unsigned)({lov[-1]} + {t}) < (unsigned){idims[-1]}"
                        cond = f"{rowok} && {cond}" if rowok else cond
                        e = f"(({cond}) ? {e} : {fill})"
                    vals.append(e)
                hc = f"{hv}_{c}"
                out_l.append(f"        float {hc} = {vals[0]};")
                out_l += [f"        {{ float v = {v}; {fold(hc, 'v')} }}" for v in vals[1:]]
                for j in js:  # the first row folded into an output sets it (-inf / 0 folded with h is h)
                    a = accs[j][c]
                    out_l.append(f"        {fold(a, hc) if (j, c) in started else f'{a} = {hc};'}")
                    started.add((j, c))
            out_l.append("        }")
        return "\n".join(out_l)

    init = "\n".join(f"        float {a} = {fill};" for row in accs for a in row)
    # stores: output j of the item (row coordinate + j), its divisor, the epilogue on store
    ocoords = [f"(kf_long){v}" for v in ov]

    def stores(masked: bool) -> str:
        s_l = []
        for j in range(R):
            for c in range(C):
                oc = list(ocoords)
                if nd >= 2:
                    oc[-2] = f"((kf_long){ov[-2]} + {j})"
                if C > 1:
                    oc[-1] = f"((kf_long){ov[-1]} + {c})"
                cs = [*pcoords, *oc]
                st, _, _ = L.epilogue(node, out, cs, "float")
                flat = f"{qplane}"
                for i in range(nd):
                    flat = f"({flat} * {od[i]} + {oc[i]})"
                fin = ""
                if kind == "avg":
                    if masked:
                        ocs = [f"{ov[i]}" for i in range(nd)]
                        if nd >= 2:
                            ocs[-2] = f"({ov[-2]} + {j})"
                        if C > 1:
                            ocs[-1] = f"({ov[-1]} + {c})"
                        div = divisor_of(ocs, [str(v) for v in K], [str(v) for v in S], [str(v) for v in P])
                    else:
                        div = lit(float(divisor)) if divisor else lit(float(_prod(K)))
                    fin = f"acc = acc / ({div}); "
                line = f"{{ float acc = {accs[j][c]}; {fin}y[{flat}] = {st}; }}"
                keep = [f"{ov[-2]} + {j} < {od[-2]}"] if masked and R > 1 else []
                keep += [f"{ov[-1]} + {c} < {od[-1]}"] if masked and C > 1 else []
                if keep:
                    line = f"if ({' && '.join(keep)}) {line}"
                s_l.append("        " + line)
        return "\n".join(s_l)

    plane_dec = ""
    if lead:
        lead_dims = odims[:lead]
        parts = unflat(qplane, lead_dims)
        plane_dec = "\n".join(
            f"        const kf_long {pc} = {e};" for pc, e in zip(pcoords, parts, strict=True)
        )
    body_fast = f"{init}\n{taps(False)}\n{stores(False)}"
    body_slow = f"{init}\n{taps(True)}\n{stores(True)}"
    used = any(re.search(rf"\b{pc}\b", body_fast + body_slow) for pc in pcoords)
    return (
        f"    const kf_long items = {items};\n"
        f"    for (kf_long g = KF_GID; g < items; g += KF_GSTRIDE) {{\n{dec}"
        + "\n".join(lines)
        + ("\n" + plane_dec if used else "")
        + f"\n        if ({' && '.join(inside)}) {{\n{body_fast}\n        }} else {{\n{body_slow}\n        }}\n    }}"
    )


#: The vector path's float4 load, store and splat (16-byte aligned addresses on CUDA).
VEC4 = {
    "cuda": (
        "#ifndef KF_PLD4\n"
        "#define KF_PLD4(p) (*reinterpret_cast<const float4*>(p))\n"
        "#define KF_PST4(p, a, b, c, d) (*reinterpret_cast<float4*>(p) = make_float4((a), (b), (c), (d)))\n"
        "#define KF_PSPLAT4(v) make_float4((v), (v), (v), (v))\n"
        "#endif\n"
    ),
    "opencl": (
        "#ifndef KF_PLD4\n"
        "#define KF_PLD4(p) vload4(0, (p))\n"
        "#define KF_PST4(p, a, b, c, d) vstore4((float4)((a), (b), (c), (d)), 0, (p))\n"
        "#define KF_PSPLAT4(v) ((float4)((v), (v), (v), (v)))\n"
        "#endif\n"
    ),
}


def vector_plan(static: tuple[tuple[int, ...], ...], nd: int) -> tuple[int, int, list[int]] | None:
    """The vector path's (rows per item, offset of the span in its first float4, float4 chunks of a
    row's span holding a tap), or None where a row's chunks would hold more than ``MAX_VEC_SPAN`` floats.

    An item's ``VEC`` outputs start at column ``VEC * q * S - P``: its offset in a float4 is ``-P mod 4``
    for every item, so the chunks and the taps' places in them are known now."""
    K, S, P, D = static
    off = (-P[-1]) % VEC
    taps = {c * S[-1] + kw * D[-1] + off for c in range(VEC) for kw in range(K[-1])}
    chunks = sorted({t // VEC for t in taps})
    if VEC * len(chunks) > MAX_VEC_SPAN:
        return None
    R = ROWS if nd >= 2 and (K[-2] - 1) * D[-2] + 1 > S[-2] else 1
    return R, off, chunks


def shift_wanted(static: tuple[tuple[int, ...], ...]) -> bool:
    """Whether rows that are not whole float4s take the shifted vector path (chunks aligned in memory,
    each row's span shifted out of them): where a row's windows overlap or their stride is at most 2
    (the scalar path's loads of a warp are then strided, each load a fraction of its sectors)."""
    K, S, _, D = static
    return (K[-1] - 1) * D[-1] + 1 > S[-1] or S[-1] <= 2


def _vectorised(
    L: Lowering,
    node: fx.Node,
    kind: str,
    nd: int,
    x: Val,
    out: tuple[int, ...],
    odims: list[str],
    lead: int,
    static: tuple[tuple[int, ...], ...],
    divisor: int | None,
    divisor_of: Any,
    clip: bool,
    shifted: bool = False,
) -> str:
    """The kernel body for the window ``static`` where the input's rows are whole float4s (the last dim
    a multiple of 4, the buffer 16-byte aligned; checked when called).

    A work item is ``R`` output rows x ``VEC`` adjacent output columns (consecutive items: adjacent
    column groups, a warp's float4 loads contiguous). Each input row of the span is read as the aligned
    float4 chunks that hold a tap (a chunk is wholly inside or wholly outside the row: one unsigned
    compare per chunk and row masks borders, padding and ceil-mode windows, filling -inf / 0, with no
    separate border path); its taps are reduced once per output column and folded into the outputs
    whose windows hold the row. Stores are float4 where the output row is a multiple of 4 long.
    ``clip``: the average's divisor depends on the window's place (else the window's size)."""
    K, S, P, D = static
    plan = vector_plan(static, nd)
    assert plan is not None
    R, off, chunks = plan
    C = VEC
    idims = x.dims[lead:]
    od = odims[lead:]
    B = _blocks(static, nd, R)
    item_sp = [od[i] if B[i] == 1 else f"(({od[i]} + {B[i] - 1}) / {B[i]})" for i in range(nd - 1)]
    item_sp.append(f"(({od[-1]} + {C - 1}) / {C})")
    planes = " * ".join(f"(kf_long){dm}" for dm in odims[:lead]) or "(kf_long)1"
    qn = [L.fresh("q") for _ in item_sp]
    qplane = L.fresh("qp")
    items = f"{planes} * " + " * ".join(f"(kf_long){dm}" for dm in item_sp)
    dec = decompose("g", [f"({planes})", *item_sp], [qplane, *qn], "items")
    o = [f"(int){q}" if i == nd - 1 or B[i] == 1 else f"((int){q} * {B[i]})" for i, q in enumerate(qn)]
    o[-1] = f"((int){qn[-1]} * {C})"
    ov = [L.fresh("o") for _ in range(nd)]
    lov = [L.fresh("lo") for _ in range(nd)]
    a0 = L.fresh("a")
    strides = [" * ".join(idims[i + 1 :]) or "1" for i in range(nd)]
    span = [(K[i] - 1) * D[i] + 1 + (B[i] - 1) * S[i] for i in range(nd - 1)]
    psize = " * ".join(f"(kf_long){dm}" for dm in idims)
    lines = [f"        const int {ov[i]} = {o[i]};" for i in range(nd)]
    lines += [f"        const int {lov[i]} = {ov[i]} * {S[i]} - {P[i]};" for i in range(nd)]
    lines.append(f"        const int {a0} = {lov[-1]} - {off};")
    lines.append(f"        const KF_G float* xb = {L.ptr(x.buffer or '')} + {qplane} * ({psize});")
    fill = "-INFINITY" if kind == "max" else "0.0f"
    taps = sorted({c * S[-1] + kw * D[-1] + off for c in range(C) for kw in range(K[-1])})
    if shifted:  # the chunks are aligned in memory: a row's span starts at a run-time place in them
        shp = L.fresh("sh")
        lines.append(f"        const int {shp} = (int)(({qplane} * ({psize})) & 3);")
        cm = {t: L.fresh("cm") for t in taps}
        lines += [
            f"        const bool {cm[t]} = (unsigned)({a0} + {t}) < (unsigned){idims[-1]};" for t in taps
        ]
        sel = sorted({q for t in taps for q in (t, t + 2)})
        chunks = sorted({r // VEC for q in sel for r in (q, q + 1)})
    else:
        cok = {k: L.fresh("cok") for k in chunks}
        lines += [
            f"        const bool {cok[k]} = (unsigned)({a0} + {VEC * k}) < (unsigned){idims[-1]};"
            for k in chunks
        ]
    outs = list(itertools.product(*(range(b) for b in B)))  # the item's output rows (offsets per dim)
    accs = {jt: [L.fresh("acc") for _ in range(C)] for jt in outs}
    lines += [f"        float {a} = {fill};" for row in accs.values() for a in row]

    def fold(a: str, v: str) -> str:
        return f"KF_PMAX({a}, {v});" if kind == "max" else f"{a} += {v};"

    combos: list[tuple[int, ...]] = [()]
    for sp in span:
        combos = [(*c, t) for c in combos for t in range(sp)]
    started: set[tuple[tuple[int, ...], int]] = set()
    for combo in combos:
        js = [jt for jt in outs if _row_in_window(combo, jt, K, S, D)]
        if not js:
            continue
        off_row = " + ".join([f"({lov[i]} + {t}) * {strides[i]}" for i, t in enumerate(combo)] + [a0])
        rowok = " && ".join(f"(unsigned)({lov[i]} + {t}) < (unsigned){idims[i]}" for i, t in enumerate(combo))
        rv = L.fresh("r")
        if shifted:
            lines.append(f"        {{ const int {rv}_sh = ({shp} + ({off_row})) & 3;")
            lines.append(f"        const KF_G float* {rv} = xb + ({off_row}) - {rv}_sh;")
        else:
            lines.append(f"        {{ const KF_G float* {rv} = xb + ({off_row});")
        if rowok:
            lines.append(f"        const bool {rv}_ok = {rowok};")
        for k in chunks:
            if shifted:  # a chunk holding a column of the row: inside the input's 16-byte blocks
                first = f"{a0} - {rv}_sh + {VEC * k}"
                ok = f"{first} + {VEC - 1} >= 0 && {first} < {idims[-1]}"
                ok = f"{rv}_ok && {ok}" if rowok else ok
            else:
                ok = f"{rv}_ok && {cok[k]}" if rowok else cok[k]
            lines.append(
                f"        const float4 {rv}_{k} = {ok} ? KF_PLD4({rv} + {VEC * k}) : KF_PSPLAT4({fill});"
            )
        elem = {t: _lane(rv, t) for t in taps}
        if shifted:  # element t is raw t + sh: two selects on the shift's bits, then the column's mask
            lines += [
                f"        const float {rv}_t{q} = ({rv}_sh & 1) ? {_lane(rv, q + 1)} : {_lane(rv, q)};"
                for q in sel
            ]
            for t in taps:
                e = f"(({rv}_sh & 2) ? {rv}_t{t + 2} : {rv}_t{t})"
                lines.append(f"        const float {rv}_e{t} = {cm[t]} ? {e} : {fill};")
                elem[t] = f"{rv}_e{t}"
        for c in range(C):
            el = [elem[c * S[-1] + kw * D[-1] + off] for kw in range(K[-1])]
            hc = f"{rv}_h{c}"
            lines.append(f"        float {hc} = {el[0]};")
            lines += [f"        {fold(hc, e)}" for e in el[1:]]
            for j in js:
                a = accs[j][c]
                lines.append(f"        {fold(a, hc) if (j, c) in started else f'{a} = {hc};'}")
                started.add((j, c))
        lines.append("        }")
    pcoords = [L.fresh("pc") for _ in range(lead)]
    lines += _vector_stores(
        L, node, kind, out, od, qplane, pcoords, ov, accs, static, divisor, divisor_of, clip
    )
    body = "\n".join(lines)
    if any(re.search(rf"\b{pc}\b", body) for pc in pcoords):
        parts = unflat(qplane, odims[:lead])
        body = (
            "\n".join(f"        const kf_long {pc} = {e};" for pc, e in zip(pcoords, parts, strict=True))
            + "\n"
            + body
        )
    return f"    const kf_long items = {items};\n    for (kf_long g = KF_GID; g < items; g += KF_GSTRIDE) {{\n{dec}{body}\n    }}"


def _vector_stores(
    L: Lowering,
    node: fx.Node,
    kind: str,
    out: tuple[int, ...],
    od: list[str],
    qplane: str,
    pcoords: list[str],
    ov: list[str],
    accs: dict[tuple[int, ...], list[str]],
    static: tuple[tuple[int, ...], ...],
    divisor: int | None,
    divisor_of: Any,
    clip: bool,
) -> list[str]:
    """The vector path's stores: per output row of the item its ``VEC`` results (divided, the epilogue
    applied) stored as one float4 where output rows are a multiple of 4 long, else one by one (those
    past the row's end left out)."""
    K, S, P, _ = static
    nd = len(od)
    lines = []
    blocked = [i for i in range(nd - 1) if any(jt[i] for jt in accs)]
    for jt, row in accs.items():
        at = [f"({ov[i]} + {jt[i]})" if i < nd - 1 else ov[i] for i in range(nd)]
        res = []
        for c, a in enumerate(row):
            oc = [f"(kf_long){v}" for v in at[:-1]] + [f"((kf_long){ov[-1]} + {c})"]
            st, _, _ = L.epilogue(node, out, [*pcoords, *oc], "float")
            fin = ""
            if kind == "avg":
                if clip:
                    ocs = [*at[:-1], f"({ov[-1]} + {c})"]
                    div = divisor_of(ocs, [str(v) for v in K], [str(v) for v in S], [str(v) for v in P])
                else:
                    div = lit(float(divisor)) if divisor else lit(float(_prod(K)))
                fin = f"acc = acc / ({div}); "
            v = f"{a}_s"
            res.append(v)
            lines.append(f"        float {v}; {{ float acc = {a}; {fin}{v} = {st}; }}")
        flat = qplane
        for i in range(nd):
            flat = f"({flat} * {od[i]} + (kf_long){at[i]})"
        keep = " && ".join(f"{at[i]} < {od[i]}" for i in blocked)
        keep = f"if ({keep}) " if keep else ""
        singles = " ".join(
            f"if ({ov[-1]} + {c} < {od[-1]}) y[{flat} + {c}] = {v};" for c, v in enumerate(res)
        )
        lines.append(
            f"        {keep}{{ if (({od[-1]} & {VEC - 1}) == 0) KF_PST4(y + {flat}, {', '.join(res)}); "
            f"else {{ {singles} }} }}"
        )
    return lines


def _lane(rv: str, r: int) -> str:
    """Float ``r`` of the row ``rv``'s loaded chunks."""
    return f"{rv}_{r // VEC}.{'xyzw'[r % VEC]}"


def _row_in_window(
    combo: tuple[int, ...], jt: tuple[int, ...], K: tuple[int, ...], S: tuple[int, ...], D: tuple[int, ...]
) -> bool:
    """Whether the input row at span offsets ``combo`` (the dims before the last) is a tap row of the
    item's output row ``jt`` (its offsets along those dims)."""
    for i, t in enumerate(combo):
        r = t - jt[i] * S[i]
        if r < 0 or r % D[i] or r // D[i] >= K[i]:
            return False
    return True


def _blocks(static: tuple[tuple[int, ...], ...], nd: int, R: int) -> list[int]:
    """Output rows per item along each dim before the last: ``R`` along the rows, ``DEPTH`` along a 3-D
    window's depth where its windows overlap (rows shared by neighbouring outputs read once per item)."""
    K, S, _, D = static
    B = [1] * (nd - 1)
    if nd >= 2:
        B[-1] = R
    if nd >= 3 and (K[-3] - 1) * D[-3] + 1 > S[-3]:
        B[-2] = DEPTH
    return B


def _prod(t: tuple[int, ...]) -> int:
    out = 1
    for v in t:
        out *= v
    return out


def pool_mod(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    """An ``nn.MaxPoolNd`` / ``nn.AvgPoolNd`` module call."""
    name = type(mod).__name__
    nd = int(name[-2])
    if name.startswith("Max"):
        assert isinstance(mod, nn.modules.pooling._MaxPoolNd)
        if mod.return_indices:
            raise ops._unsupported("max pooling returning indices")
        return _pool(
            L,
            node,
            "max",
            nd,
            f"{path}.kernel_size",
            f"{path}.stride",
            f"{path}.padding",
            f"{path}.dilation",
            bool(mod.ceil_mode),
            static=static_window(mod.kernel_size, mod.stride, mod.padding, mod.dilation, nd),
        )
    if name.startswith("Avg"):
        assert isinstance(mod, nn.modules.pooling._AvgPoolNd)
        return _pool(
            L,
            node,
            "avg",
            nd,
            f"{path}.kernel_size",
            f"{path}.stride",
            f"{path}.padding",
            "1",
            bool(mod.ceil_mode),
            bool(getattr(mod, "count_include_pad", True)),
            getattr(mod, "divisor_override", None),
            static_window(mod.kernel_size, mod.stride, mod.padding, 1, nd),
        )
    raise ops._unsupported(name)


def pool_fn(L: Lowering, node: fx.Node) -> Val:
    """An ``F.max_poolNd`` / ``F.avg_poolNd`` call."""
    name = str(getattr(node.target, "__name__", ""))
    nd = int(name[-2])
    k = ops._arg(node, 1, "kernel_size")
    s = ops._arg(node, 2, "stride")
    p = ops._arg(node, 3, "padding", 0)
    if name.startswith("max"):
        if ops._arg(node, 6, "return_indices", False):
            raise ops._unsupported("max pooling returning indices")
        d = ops._arg(node, 4, "dilation", 1)
        return _pool(
            L,
            node,
            "max",
            nd,
            repr(k),
            repr(s),
            repr(p),
            repr(d),
            bool(ops._arg(node, 5, "ceil_mode", False)),
            static=static_window(k, s, p, d, nd),
        )
    return _pool(
        L,
        node,
        "avg",
        nd,
        repr(k),
        repr(s),
        repr(p),
        "1",
        bool(ops._arg(node, 4, "ceil_mode", False)),
        bool(ops._arg(node, 5, "count_include_pad", True)),
        ops._arg(node, 6, "divisor_override"),
        static_window(k, s, p, 1, nd),
    )


def is_global(size: Any, nd: int) -> bool:
    """Whether an adaptive pool's ``output_size`` is one cell along every pooled dim."""
    sizes = tuple(size) if isinstance(size, (tuple, list)) else (size,) * nd
    return len(sizes) == nd and all(o == 1 for o in sizes)


def adaptive_avg(L: Lowering, node: fx.Node, size: Any, nd: int) -> Val:
    """Adaptive average pooling: output cell ``i`` averages input ``[floor(i*I/O), ceil((i+1)*I/O))``.

    Pooling to one cell per plane is a keepdim mean over the pooled dims: the reductions' split or
    blocked forms give a plane many work items (here a work item would fold a whole plane serially).
    """
    x = L.tensor(ops._args(node)[0])
    n = L.order[node]
    out = _shape(node)
    lead = len(out) - nd
    if is_global(size, nd):
        return ops.reduce(L, node, x, "mean", list(range(lead, lead + nd)), True)
    S = x.py_shape
    L.fwd(
        f"S{n} = {S}[:{lead}] + tuple(o if o is not None else {S}[{lead} + i] "
        f"for i, o in enumerate(_nt({size!r}, {nd})))"
    )

    def body(c: list[str]) -> str:
        od = L.shape_dims(f"S{n}", out)[lead:]
        idims = x.dims[lead:]
        lo = [f"(({c[lead + i]}) * {idims[i]} / {od[i]})" for i in range(nd)]
        hi = [f"((({c[lead + i]}) + 1) * {idims[i]} + {od[i]} - 1) / {od[i]}" for i in range(nd)]
        loops, ws = "", []
        for i in range(nd):
            v = L.fresh("a")
            ws.append(v)
            loops += f"for (kf_long {v} = {lo[i]}; {v} < {hi[i]}; ++{v}) "
        cnt = " * ".join(f"(float)({hi[i]} - {lo[i]})" for i in range(nd))
        return f"float acc = 0.0f;\n        {loops}acc += {x.load([*c[:lead], *ws])};\n        acc = acc / ({cnt});"

    return L.emit_pointwise(out, f"S{n}", body, "adaptiveavg", node=node)
