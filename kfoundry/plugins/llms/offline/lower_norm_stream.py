"""Long normalisation rows in one persistent kernel whose second read of a piece comes from L2.

Rows (instance norm's images, group norm's groups) are cut into pieces of :data:`PIECE` elements,
numbered row by row. A fixed grid of work-groups takes tickets from an atomic counter; for ticket ``j``
a work-group reads piece ``j`` and publishes its (mean, M2) (sums shifted by the piece's first element),
and the work-group that completes a row's pieces merges them (Chan, in a fixed order: deterministic)
into the row's mean and 1/std and raises the row's flag; the same work-group then normalises piece
``j - D`` (waiting for its row's flag). ``D`` = pieces per row + the grid's work-groups, so the row of
piece ``j - D`` is complete by then (a wait is rare) and the bytes read between a piece's two reads
(about ``D`` pieces) stay well inside L2: x is read once from DRAM. No wait can deadlock: a ticket is
taken only by a running work-group, which publishes its piece before it waits for anything, and the
row a work-group waits for has all its pieces at smaller tickets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline.elementwise_ops import fn, lit
from kfoundry.plugins.llms.offline.lower import Val

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering

#: Elements of a piece (a work-group's share of one read).
PIECE = 4096

#: Work-groups of the persistent grid: the H200's 132 SMs x 2 (CUDA); a few on PoCL.
GRID = {"cuda": 264, "opencl": 4}

#: The most bytes read between a piece's two reads for which the stream is chosen (L2 is 50 MB).
MAX_DISTANCE = 16 << 20

#: The distance allowed where a sweep doubles the piece (``SP`` 2) or the grid (``SW``): the H200's L2 is 60 MB.
MAX_DISTANCE_SWEPT = 24 << 20

#: Tests set this to run the stream on OpenCL (PoCL) in the fused schedule; CUDA takes it in fused_coop.
OPENCL = False


#: Chan et al.'s merge of (count, mean, M2) ``b`` into ``a``, as a format string over the six names
CHAN_MERGE = (
    "if ({nb} > 0.0f) {{ const float kf_nn = {na} + {nb}, kf_d = {mb} - {ma}; "
    "{ma} += kf_d * ({nb} / kf_nn); {qa} += {qb} + kf_d * kf_d * ({na} * ({nb} / kf_nn)); {na} = kf_nn; }}"
)


def chan_tree(arrays: tuple[str, str, str], indent: str) -> str:
    """A work-group's (``na``, ``ma``, ``qa``) stored to the local ``arrays`` (count, mean, M2) and merged
    pairwise in a fixed order into element 0 (barriers included); lines after the first get ``indent``."""
    a, b, c = arrays
    lines = [
        f"{a}[t] = na;",
        f"{b}[t] = ma;",
        f"{c}[t] = qa;",
        "KF_BARRIER;",
        "for (int o = BLOCK / 2; o > 0; o >>= 1) {",
        "    if (t < o) {",
        f"        float nx = {a}[t], mx = {b}[t], qx = {c}[t];",
        f"        const float ny = {a}[t + o], my = {b}[t + o], qy = {c}[t + o];",
        "        " + CHAN_MERGE.format(na="nx", nb="ny", ma="mx", mb="my", qa="qx", qb="qy"),
        f"        {a}[t] = nx; {b}[t] = mx; {c}[t] = qx;",
        "    }",
        "    KF_BARRIER;",
        "}",
    ]
    return f"\n{indent}".join(lines)


def wanted(L: Lowering, inner: int) -> bool:
    """Whether rows of ``inner`` elements take the stream in this lowering."""
    on = (L.lang == "cuda" and L.coop) or (L.lang == "opencl" and OPENCL and not L.coop)
    pp = -(-inner // PIECE)
    return on and inner >= 2 * PIECE and (pp + GRID[L.lang]) * PIECE * 4 <= MAX_DISTANCE


def uniform(
    weight: str | None, bias: str | None, param: Callable[[str, int | None], str], divided: str | None
) -> tuple[str, str, str] | None:
    """(scale, offset, whether a piece has one pair) of the affine step ``(v - mean) * scale + offset``
    where a piece's elements can share one pair of affine parameters, as C over the piece (``c0``,
    ``len``, ``kf_pb``); None where every element has its own (layer norm's per-element parameters)."""
    if weight is None and bias is None:
        return "kf_rstd", "0.0f", "1"
    first = param("c0", None)
    if divided is None and "c0" in first:
        return None
    sc = f"kf_rstd * {weight}[{first}]" if weight is not None else "kf_rstd"
    of = f"{bias}[{first}]" if bias is not None else "0.0f"
    uni = (
        f"(unsigned)c0 / (unsigned)({divided}) == (unsigned)(c0 + len - 1) / (unsigned)({divided})"
        if divided
        else "1"
    )
    return sc, of, uni


def stream_normalise(
    L: Lowering,
    node: fx.Node,
    src: Val,
    s: int,
    eps: float,
    weight: str | None,
    bias: str | None,
    param: Callable[[str, int | None], str],
    base_fn: Callable[[str], str],
    divided: str | None,
    tag: str,
) -> Val:
    """``src``'s rows (its dims from ``s`` on, one contiguous run per row) normalised in one kernel;
    ``param(q, k)`` indexes the affine parameters (see ``lower_stats.normalise``)."""
    f = lambda name: fn(name, L.lang)  # noqa: E731
    n = L.order[node]
    S = src.py_shape
    grid = str(GRID[L.lang])
    piece_py = str(PIECE)
    if L.lang == "cuda":  # SW work-groups per SM (the H200's 132), pieces of SP x PIECE where they fit
        grid, piece_py = "_kf_sg", "_kf_piece"
        L.fwd("_kf_sg = 132 * p['SW']")
        L.fwd(
            f"_kf_piece = {PIECE} * p['SP'] if (_cdiv(_prod({S}[{s}:]), {PIECE} * p['SP']) + _kf_sg) * "
            f"{PIECE} * p['SP'] * 4 <= {MAX_DISTANCE_SWEPT} else {PIECE}"
        )
    L.fwd(
        f"Z{n} = (_prod({S}[:{s}]), _prod({S}[{s}:]), _cdiv(_prod({S}[{s}:]), {piece_py}), "
        f"int(_prod({S}[{s}:]) % 4 == 0 and {src.buffer}.data_ptr() % 16 == 0))"
    )
    L.fwd(f"Z{n}d = Z{n}[2] + {grid}")
    L.fwd(f"assert Z{n}[0] * Z{n}[2] + Z{n}d + {grid} < 2**31")
    rows, inner, pp, vec = (L.sym(f"Z{n}[{k}]") for k in range(4))
    D = L.sym(f"Z{n}d")
    L.fwd(f"W{n}i = torch.zeros(1 + 2 * Z{n}[0], dtype=torch.int32, device=dev)")
    L.fwd(f"W{n}f = torch.empty(2 * Z{n}[0] * Z{n}[2] + 2 * Z{n}[0], dtype=torch.float32, device=dev)")
    wi, wf = L.ptr(f"W{n}i", "int"), L.ptr(f"W{n}f")
    xp = L.ptr(src.buffer or "")
    if L.lang == "cuda":
        add, xchg, fence = "atomicAdd", "atomicExch", "__threadfence()"
        ld4 = "reinterpret_cast<const float4*>(p)[i]"
        # the second read is the piece's last use and the output is not read again: both evict-first,
        # so that they do not push the pieces still waiting for their second read out of L2
        ld4_last = "__ldcs(reinterpret_cast<const float4*>(p) + i)"
        st4 = "__stcs(reinterpret_cast<float4*>(o) + i, make_float4({v}))"
        spin = "__nanosleep(64);"
        zero4 = "make_float4(0.0f, 0.0f, 0.0f, 0.0f)"
    else:
        add, xchg, fence = "atomic_add", "atomic_xchg", "mem_fence(CLK_GLOBAL_MEM_FENCE)"
        ld4 = ld4_last = "vload4(i, p)"
        st4 = "KF_STORE4(o, 4 * i, {v})"
        spin = ""
        zero4 = "(float4)(0.0f, 0.0f, 0.0f, 0.0f)"
    V = "(KF_PIECE / (4 * BLOCK))"

    def one(v: str, q: str, k: int | None) -> str:
        e = f"(({v}) - kf_mean) * kf_rstd"
        if weight is not None:
            e = f"({e} * {weight}[{param(q, k)}])"
        if bias is not None:
            e = f"({e} + {bias}[{param(q, k)}])"
        return e

    chq = (
        f"const unsigned kf_q0 = (unsigned)(c0 + 4 * i), kf_ch = kf_q0 / (unsigned)({divided}), "
        f"kf_nx = (kf_ch + 1u) * (unsigned)({divided}); "
        if divided
        else ""
    )
    vec4 = f"{vec} && (unsigned)({divided}) >= 4u" if divided else vec
    outs = ", ".join(one(f"w.{c}", f"c0 + 4 * i + {k}", k) for k, c in enumerate("xyzw"))
    scal = " ".join(
        f"if (4 * i + {k} < len) o[4 * i + {k}] = {one(f'w.{c}', f'c0 + 4 * i + {k}', None)};"
        for k, c in enumerate("xyzw")
    )
    merge = CHAN_MERGE
    piece = """const int row = (int)({j} / {pp});
            const kf_long c0 = ((kf_long){j} - (kf_long)row * {pp}) * {P};
            const kf_long left = (kf_long){inner} - c0;
            const int len = (int)(left < {P} ? left : {P});
            KF_G const float* p = {xp} + (kf_long)row * {inner} + c0;"""
    fast = uniform(weight, bias, param, divided)

    def loads(arr: str, ld: str) -> str:
        return (
            f"if ({vec}) {{ for (int u = 0; u < {V}; ++u) {{ const int i = t + u * BLOCK; "
            f"{arr}[u] = 4 * i < len ? {ld} : {zero4}; }} }} "
            f"else {{ for (int u = 0; u < {V}; ++u) {{ const int i = t + u * BLOCK; {arr}[u] = {zero4}; "
            + " ".join(f"if (4 * i + {k} < len) {arr}[u].{c} = p[4 * i + {k}];" for k, c in enumerate("xyzw"))
            + " } }"
        )

    if L.lang == "cuda":  # warp sums, then one value per warp summed by item 0 (a fixed order)
        reduce = """s1 = kf_wsum(s1);
            s2 = kf_wsum(s2);
            if ((t & 31) == 0) { kf_a[t >> 5] = s1; kf_b[t >> 5] = s2; }
            KF_BARRIER;
            if (t == 0) {
                float a = 0.0f, q = 0.0f;
                for (int w = 0; w < BLOCK / 32; ++w) { a += kf_a[w]; q += kf_b[w]; }"""
    else:
        reduce = """kf_a[t] = s1;
            kf_b[t] = s2;
            KF_BARRIER;
            for (int o = BLOCK / 2; o > 0; o >>= 1) {
                if (t < o) { kf_a[t] += kf_a[t + o]; kf_b[t] += kf_b[t + o]; }
                KF_BARRIER;
            }
            if (t == 0) {
                const float a = kf_a[0], q = kf_b[0];"""
    if fast is None:
        vec_store = f"{chq}{st4.format(v=outs)};"
        prep = ""
    else:
        sc, of, uni = fast
        fouts = ", ".join(f"(w.{c} - kf_mean) * kf_sc + kf_of" for c in "xyzw")
        if uni == "1":  # one pair a row (or none)
            prep = f"const float kf_sc = {sc}, kf_of = {of};"
            vec_store = f"{st4.format(v=fouts)};"
        else:  # a piece within one channel: one pair, a multiply-add an element
            prep = (
                f"const int kf_uni = {uni};\n"
                f"            const float kf_sc = kf_uni ? {sc} : 0.0f, kf_of = kf_uni ? {of} : 0.0f;"
            )
            vec_store = f"if (kf_uni) {st4.format(v=fouts)}; else {{ {chq}{st4.format(v=outs)}; }}"
    text = f"""    KF_LOCAL float kf_a[BLOCK];
    KF_LOCAL float kf_b[BLOCK];
    KF_LOCAL float kf_c[BLOCK];
    KF_LOCAL int kf_s[3];
    const int t = KF_LID(0);
    KF_G int* ws = (KF_G int*){wi};
    KF_G float* pf = (KF_G float*){wf};
    const kf_long total = (kf_long){rows} * {pp};
    KF_G float* fin = pf + 2 * total;
    if (t == 0) kf_s[0] = {add}(ws, 1);
    KF_BARRIER;
    kf_long j = kf_s[0];
    int crow = -1;  // the row whose statistics this work-group holds (rows come in order: few waits)
    float kf_mean = 0.0f, kf_rstd = 0.0f;
    float4 va[{V}];
    float4 vb[{V}];
    if (j < total) {{
        {piece.format(j="j", pp=pp, P="KF_PIECE", inner=inner, xp=xp)}
        {loads("va", ld4)}
    }}
    while (j < total + {D}) {{
        const kf_long k = j - {D};
        KF_BARRIER;  // every item has read the last ticket
        if (t == 0) kf_s[2] = {add}(ws, 1);  // the next ticket, taken under this one's work
        if (k >= 0) {{
            {piece.format(j="k", pp=pp, P="KF_PIECE", inner=inner, xp=xp)}
            {loads("vb", ld4_last)}
        }}
        if (j < total) {{  // the statistics of piece j
            {piece.format(j="j", pp=pp, P="KF_PIECE", inner=inner, xp=xp)}
            const float shift = p[0];
            float s1 = 0.0f, s2 = 0.0f;
            for (int u = 0; u < {V}; ++u) {{
                const int i = t + u * BLOCK;
                const float d0 = 4 * i < len ? va[u].x - shift : 0.0f, d1 = 4 * i + 1 < len ? va[u].y - shift : 0.0f;
                const float d2 = 4 * i + 2 < len ? va[u].z - shift : 0.0f, d3 = 4 * i + 3 < len ? va[u].w - shift : 0.0f;
                s1 += (d0 + d1) + (d2 + d3);
                s2 += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
            }}
            {reduce}
                const float m2 = q - a * (a / (float)len);
                pf[2 * j] = shift + a / (float)len;
                pf[2 * j + 1] = m2 > 0.0f ? m2 : 0.0f;
                {fence};  // the partial before the arrival
                kf_s[1] = {add}(ws + 1 + row, 1) == {pp} - 1;
            }}
        }}
        KF_BARRIER;
        const kf_long jn = kf_s[2];
        const int last = j < total && kf_s[1];
        if (jn < total) {{  // the next piece's loads in flight under the merge and the normalisation
            {piece.format(j="jn", pp=pp, P="KF_PIECE", inner=inner, xp=xp)}
            {loads("va", ld4)}
        }}
        if (last) {{  // piece j was its row's last: merge the row's pieces (Chan, a fixed order)
            const int row = (int)(j / {pp});
            {fence};
            float na = 0.0f, ma = 0.0f, qa = 0.0f;
            for (kf_long q = t; q < {pp}; q += BLOCK) {{
                const kf_long qc = q * KF_PIECE, ql = (kf_long){inner} - qc;
                const float nb = (float)(ql < KF_PIECE ? ql : KF_PIECE);
                const float mb = ((volatile KF_G float*)pf)[2 * ((kf_long)row * {pp} + q)];
                const float qb = ((volatile KF_G float*)pf)[2 * ((kf_long)row * {pp} + q) + 1];
                {merge.format(na="na", nb="nb", ma="ma", mb="mb", qa="qa", qb="qb")}
            }}
            {chan_tree(("kf_a", "kf_b", "kf_c"), "            ")}
            if (t == 0) {{
                const float var = kf_c[0] / kf_a[0];
                fin[2 * row] = kf_b[0];
                fin[2 * row + 1] = {f("rsqrt")}((var > 0.0f ? var : 0.0f) + {lit(eps)});
                {fence};  // the statistics before the flag
                {xchg}(ws + 1 + {rows} + row, 1);
            }}
        }}
        if (k >= 0) {{  // piece j - D: its row's statistics ready (or soon)
            {piece.format(j="k", pp=pp, P="KF_PIECE", inner=inner, xp=xp)}
            if (row != crow) {{  // a new row: wait for its flag, then load its statistics once
                if (t == 0) {{
                    while ({add}(ws + 1 + {rows} + row, 0) == 0) {{ {spin} }}
                    {fence};
                }}
                KF_BARRIER;
                kf_mean = ((volatile KF_G float*)fin)[2 * row];
                kf_rstd = ((volatile KF_G float*)fin)[2 * row + 1];
                crow = row;
            }}
            const kf_long kf_pb = {base_fn("row")}; (void)kf_pb;
            {prep}
            KF_G float* o = y + (kf_long)row * {inner} + c0;
            for (int u = 0; u < {V}; ++u) {{
                const int i = t + u * BLOCK;
                const float4 w = vb[u];
                if ({vec4}) {{ if (4 * i < len) {{ {vec_store} }} }}
                else {{ {scal} }}
            }}
        }}
        j = jn;
    }}"""
    del xp
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty({S}, dtype=torch.float32, device=dev)")
    launch = f"grid=({grid}, 1, 1), block=(p['BLOCK'], 1, 1)"
    name = L.kernel(text, "float", "", f"{tag}_stream", launch_dims=launch)
    kern = L.sched.kernels[-1]
    kern.source = f"#ifndef KF_PIECE\n#define KF_PIECE {PIECE}\n#endif\n" + kern.source
    if L.lang == "cuda":
        kern.launch = kern.launch.replace("self.prog.", "self._program(KF_PIECE=_kf_piece).")
    L.fwd(kern.launch)
    return L.buffer_val(name, src.shape, S)
