"""Convolution as an implicit GEMM (the fused schedules of :mod:`.lower`).

For one image ``nb`` and one group ``g`` the output is the product of an ``M x K`` filter matrix
(``M`` = output channels of the group, ``K`` = input channels of the group times the kernel's taps)
and a ``K x P`` patch matrix (``P`` = output positions) that is never built: each 16-deep step of K
gathers its patch tile from the input into local memory (zero where the tap falls in the padding or,
transposed, between the strided input positions) and its filter tile beside it. 16 x 16 threads each
hold a CM x CN register block of a 16CM x 16CN output tile; the next step's loads are in registers
while this step multiplies. The position of a thread's patch columns is decomposed once, outside the
K loop, in 32-bit arithmetic. The output is written where it lies in the NC... layout, with the
anchor's elementwise epilogue applied on store; where a mean or sum over every spatial dim (or a
one-cell adaptive average pool) is the only consumer, each tile writes its per-(image, channel) sums
instead and a small fold finishes the reduction (:mod:`.lower_conv_pool`).

A transposed convolution is the same product over its output positions (the gradient-style gather:
input position ``(o + pad - k * dil) / stride`` where that divides exactly); grouped and depthwise
convolutions take the group from the grid's third axis.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline import lower_conv_pool
from kfoundry.plugins.llms.offline.index_width import fits_int32
from kfoundry.plugins.llms.offline.lower import Val, horner

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering

#: Smallest output channels per group worth a GEMM tile; below it the direct kernel is kept.
MIN_ROWS = 4


#: Thread blocks an H200 holds two of per SM (132 SMs): a tile choice must leave at least this many.
MIN_TILES = 2 * 132

#: Tiles the 128 x 256 choice needs (one 256-thread block per SM at its ~200 registers): four waves, so
#: the last one's tail costs little.
MIN_WIDE_TILES = 4 * 132


def _tiles(rows: int, cols: int, batch: int, cm: int, cn: int) -> int:
    """Output tiles of 16CM x 16CN of a product of ``rows`` x ``cols`` per each of ``batch``."""
    return -(-rows // (16 * cm)) * -(-cols // (16 * cn)) * batch


def conv_blocks(conv_sizes: list[tuple[int, int, int]]) -> tuple[int, int]:
    """(CM, CN) of the largest implicit-GEMM convolution of ``conv_sizes`` ((output channels per group,
    output positions, images x groups)). From the H200 sweeps of session 5 (call F) and session 11: up to
    32 output channels per group 32 x 128 tiles (CM 2, CN 8), up to 96 64 x 128 (CM 4, CN 8: 32.2 ms
    where 64 x 64 took 44.7 on conv_transpose2d_maxpool_hardtanh_mean_tanh's 64-channel, K = 576
    product; 3.51 against 3.45 at K = 72); from 97 (KernelBench's
    128-channel convolutions) 128 x 64 (CM 8, CN 4): twice the multiply-adds per patch gather and per
    local-memory read of the filter tile at 127 registers (two 256-thread blocks per SM still fit; 128 x 128
    takes 161, one block). Where such a product has at least ``MIN_WIDE_TILES`` tiles of 128 x 256, those
    (CM 8, CN 16: sgemm_warp's 128 x 256 x 16 block of 8 x 16 per thread, one block per SM): a quarter of
    the gathers, table reads and shared-memory reads per multiply-add. Narrower columns (or rows) where
    that leaves fewer than ``MIN_TILES`` tiles."""
    rows, cols, batch = max(conv_sizes, key=lambda s: s[0] * s[1] * s[2])

    def tiles(cm: int, cn: int) -> int:
        return _tiles(rows, cols, batch, cm, cn)

    if rows > 96 and tiles(8, 16) >= MIN_WIDE_TILES:
        return 8, 16
    if rows > 96 and tiles(8, 4) >= MIN_TILES:
        return 8, 4
    cm = 2 if rows <= 32 else 4
    for cn in (8, 4):
        if tiles(cm, cn) >= MIN_TILES:
            return cm, cn
    return cm, 2


def _prod(dims: list[str]) -> str:
    return "(" + " * ".join(dims) + ")" if dims else "1"


def _unflat_int(flat: str, dims: list[str], names: list[str]) -> str:
    """C statements setting ``names`` to the row-major coordinates of ``flat`` over ``dims`` (int)."""
    out, rest = [], flat
    for k in range(len(dims) - 1, 0, -1):
        q = f"{names[k]}_q"
        out.append(f"const int {q} = {rest} / {dims[k]}; const int {names[k]} = {rest} - {q} * {dims[k]};")
        rest = q
    out.append(f"const int {names[0]} = {rest};")
    return " ".join(out)


def _vec_read(lang: str, dst: str, row: str, start: str, count: str) -> str:
    """Read ``count`` (a macro: 1, 2, 4 or 8) floats of local memory ``row[start...]`` into ``dst[]``,
    four or two at a time where ``count`` allows (``start`` is then a multiple of it)."""
    src = f"{row}[{start} + q]"
    v4 = f"vload4(0, &{src})" if lang == "opencl" else f"*reinterpret_cast<const float4*>(&{src})"
    v2 = f"vload2(0, &{src})" if lang == "opencl" else f"*reinterpret_cast<const float2*>(&{src})"
    return f"""#if {count} % 4 == 0
            #pragma unroll
            for (int q = 0; q < {count}; q += 4) {{
                const float4 t4 = {v4};
                {dst}[q] = t4.x; {dst}[q + 1] = t4.y; {dst}[q + 2] = t4.z; {dst}[q + 3] = t4.w;
            }}
#elif {count} % 2 == 0
            #pragma unroll
            for (int q = 0; q < {count}; q += 2) {{
                const float2 t2 = {v2};
                {dst}[q] = t2.x; {dst}[q + 1] = t2.y;
            }}
#else
            #pragma unroll
            for (int q = 0; q < {count}; ++q) {dst}[q] = {src};
#endif"""


def _ld4(lang: str, src: str) -> str:
    """``const float4 t4`` read from local memory at ``src`` (16-byte aligned)."""
    if lang == "opencl":
        return f"const float4 t4 = vload4(0, &{src});"
    return f"const float4 t4 = *reinterpret_cast<const float4*>(&{src});"


#: Launch bounds of the CUDA conv tile: more than 32 accumulators (the 128 x 256 tiles) one 256-thread
#: block per SM; the smaller tiles none. A (256, 2) bound there let nvcc take 89-95 registers where it
#: takes 55-80 unbounded: two blocks per SM instead of three or four, and 18-29% slower on the H200
#: (session 10, call 2); a (256, 4) bound spills.
CONV_BOUNDS = (
    "#if (CM) * (CN) > 32\n#define KF_CONV_BOUNDS __launch_bounds__(256, 1)\n"
    "#else\n#define KF_CONV_BOUNDS\n#endif\n"
)

#: Bytes of the two double-buffered tiles: the launch's dynamic shared memory on CUDA for the 128 x 256
#: tiles (49.7 KB, past the static 48 KB); static shared memory for the smaller ones (as dynamic, nvcc
#: took 63-69 registers where it takes 55-56 static: four blocks per SM down to three).
SMEM_PY = "(4 * 2 * 16 * (16 * p['CM'] + 4 + 16 * p['CN'] + 4) if p['CM'] * p['CN'] > 32 else 0)"


def _tiles_decl(lang: str, smem: str) -> str:
    """The filter tile ``As[2][16][16CM + 4]`` (stored transposed) and the patch tile
    ``Bs[2][16][16CN + 4]``: local arrays on OpenCL; on CUDA views of dynamic shared memory ``smem`` for the
    128 x 256 tiles, static shared arrays for the smaller ones (:data:`SMEM_PY`)."""
    if lang == "opencl":
        return "    KF_LOCAL float As[2][16][16 * CM + 4];\n    KF_LOCAL float Bs[2][16][16 * CN + 4];"
    return f"""#if (CM) * (CN) > 32
    extern __shared__ __align__(16) float {smem}[];
    float (*As)[16][16 * CM + 4] = reinterpret_cast<float (*)[16][16 * CM + 4]>({smem});
    float (*Bs)[16][16 * CN + 4] = reinterpret_cast<float (*)[16][16 * CN + 4]>({smem} + 2 * 16 * (16 * CM + 4));
#else
    __shared__ __align__(16) float As[2][16][16 * CM + 4];
    __shared__ __align__(16) float Bs[2][16][16 * CN + 4];
#endif"""


def emit_conv_gemm(
    L: Lowering,
    node: fx.Node,
    x: Val,
    w: Val,
    bias: str | None,
    transposed: bool,
    geometry: tuple[list[str], list[str], list[str], str],
    out: tuple[int, ...],
    py_shape: str,
    groups_py: str,
    groups: int,
    stride_py: list[str],
) -> Val:
    """The implicit-GEMM kernel of convolution ``node`` (``geometry``: stride, padding, dilation C
    names per spatial dim and the group count's); ``out`` is its traced output shape."""
    st, pd, dl, G = geometry
    nd = len(out) - 2
    odims = L.shape_dims(py_shape, out)
    xs, os_, ks = x.dims[2:], odims[2:], w.dims[2:]
    cin, cout = x.dims[1], odims[1]
    P, KV = _prod(os_), _prod(ks)
    cin_g, cout_g = (f"({cin} / {G})", w.dims[1]) if transposed else (w.dims[1], f"({cout} / {G})")
    wp = L.ptr(str(w.buffer))
    # offsets from a thread's hoisted filter row in 32 bits where the whole filter fits (index_width)
    wi = "int" if fits_int32(math.prod(w.shape)) else "kf_long"
    xs_flat = _prod(xs)
    tn, on, un = [f"t{d}" for d in range(nd)], [f"o{d}" for d in range(nd)], [f"u{d}" for d in range(nd)]
    nf = 3 + nd  # table fields: ci, input offset, flat tap, displacement per dim
    if transposed:
        # output phase (o mod stride) of this block: only the taps landing on whole input positions
        # contribute, at input position u + e (u = o div stride), no division per element
        ph_decl = _unflat_int("ph", st, [f"r{d}" for d in range(nd)])
        counts = "".join(
            f"    int n{d} = 0;\n    for (int q = 0; q < {ks[d]}; ++q) n{d} += (r{d} + {pd[d]} - q * {dl[d]}) % {st[d]} == 0;\n"
            for d in range(nd)
        )
        head = f"""    const int ph = bz % {_prod(st)}, ng = bz / {_prod(st)}, nb = ng / {G}, g = ng - nb * {G};
    {ph_decl}
{counts}{"".join(f"    const int U{d} = ({os_[d]} + {st[d]} - 1) / {st[d]};{chr(10)}" for d in range(nd))}\
    const int KVE = {_prod([f"n{d}" for d in range(nd)])}, KK = {cin_g} * KVE, PC = {_prod([f"U{d}" for d in range(nd)])};
"""
        scan = "".join(
            f"""            int {t} = 0;
            for (int q = 0, c = 0; q < {ks[d]}; ++q)
                if ((r{d} + {pd[d]} - q * {dl[d]}) % {st[d]} == 0) {{ if (c == i{d}) {t} = q; ++c; }}
            const int e{d} = (r{d} + {pd[d]} - {t} * {dl[d]}) / {st[d]};
"""
            for d, t in enumerate(tn)
        )
        fill_body = f"""const int ci = kq / KVE; const int rr = kq - ci * KVE;
            {_unflat_int("rr", [f"n{d}" for d in range(nd)], [f"i{d}" for d in range(nd)])}
{scan}            kt[kfb][0][e] = ci;
            kt[kfb][1][e] = ci * {xs_flat} + {horner([f"e{d}" for d in range(nd)], xs)};
            kt[kfb][2][e] = {horner(tn, ks)};
{"".join(f"            kt[kfb][{3 + d}][e] = e{d};{chr(10)}" for d in range(nd))}"""
        col = f"""const int j = j0 + bj;
        {_unflat_int("j", [f"U{d}" for d in range(nd)], un)}
        {" ".join(f"const int {o} = r{d} + {st[d]} * {u};" for d, (o, u) in enumerate(zip(on, un, strict=True)))}
        jok = j < PC && {" && ".join(f"{o} < {os_[d]}" for d, o in enumerate(on))};
        {" ".join(f"jb{d} = {u};" for d, u in enumerate(un))}"""
        w_base = f"((kf_long)g * {cin_g} * {cout_g} + i0 + ty) * {KV}"
        a_load = f"wr[({wi})kt[kbuf][0][tx] * ({cout_g} * {KV}) + l * (16 * {KV}) + kt[kbuf][2][tx]]"
        cols = "PC"
    else:
        head = f"""    const int nb = bz / {G}, g = bz - nb * {G};
    const int KK = {cin_g} * {KV};
"""
        fill_body = f"""const int ci = kq / {KV}; const int r = kq - ci * {KV};
            {_unflat_int("r", ks, tn)}
            kt[kfb][0][e] = ci;
            kt[kfb][1][e] = ci * {xs_flat} + {horner([f"{t} * {dl[d]}" for d, t in enumerate(tn)], xs)};
            kt[kfb][2][e] = r;
{"".join(f"            kt[kfb][{3 + d}][e] = {t} * {dl[d]};{chr(10)}" for d, t in enumerate(tn))}"""
        col = f"""const int j = j0 + bj;
        jok = j < {P};
        {_unflat_int("j", os_, on)}
        {" ".join(f"jb{d} = {o} * {st[d]} - {pd[d]};" for d, o in enumerate(on))}"""
        w_base = f"(kf_long)(g * {cout_g} + i0 + ty) * KK"
        a_load = f"wr[({wi})l * (16 * KK) + ka]"
        cols = P
    fill = f"""{{
            const int e = tid, kq = kfill + e;
            if (kq < KK) {{
            {fill_body}            }} else kt[kfb][3][e] = -0x40000000;
        }}"""
    pos = [f"(jb{d} + kt[kbuf][{3 + d}][kr])" for d in range(nd)]
    # one unsigned compare per dim (a negative position wraps past the bound)
    checks = " && ".join(f"(unsigned)({q}) < (unsigned)({xs[d]})" for d, q in enumerate(pos))
    if x.buffer is not None:  # the column's base offset plus the tap's
        x_load = "xg[colb + kt[kbuf][1][kr]]"
        xg_decl = f"    KF_G const float* xg = {L.ptr(x.buffer)} + xb;\n"
    else:  # a prologue-fused value: its loader at the (64-bit) coordinates
        xg_decl = ""
        chan = f"(g * {cin_g} + kt[kbuf][0][kr])"
        x_load = x.load(["(kf_long)nb", f"(kf_long){chan}", *[f"(kf_long){q}" for q in pos]])
    load = f"""        #pragma unroll
        for (int l = 0; l < CM; ++l) {{
            const int m = i0 + ty + 16 * l, ka = k0 + tx;
            ra[l] = (m < {cout_g} && ka < KK) ? {a_load} : 0.0f;
        }}
        #pragma unroll
        for (int l = 0; l < CN; ++l) {{
            const int kr = bk + l * (16 / CN);
            rb[l] = (jok && ({checks})) ? {x_load} : 0.0f;
        }}"""
    cs = ["(kf_long)nb", "(kf_long)co", *[f"(kf_long){o}" for o in on]]
    epi, ctype, last = L.epilogue(node, out, cs, "float")
    add = f" acc += {bias}[co];" if bias else ""
    pool = None
    if ctype == "float" and math.prod(out[2:]) >= lower_conv_pool.MIN_POSITIONS:
        pool = lower_conv_pool.spatial_reduction(L, last or node, nd)
    tile = "ph * (int)KF_NGRP0 + (int)KF_GRP(0)" if transposed else "(int)KF_GRP(0)"
    fold_lanes = bool(pool) and lower_conv_pool.partials_layout(
        L, -(-math.prod(out[2:]) // lower_conv_pool.TILE_COLS)
    )
    fold_head, fold_row, fold_tail = lower_conv_pool.fold_text(
        "CM", odims[0], cout, cout_g, tile, "KF_NTILES", fold_lanes
    )
    if transposed:
        place = f"""{_unflat_int("j", [f"U{d}" for d in range(nd)], un)}
                {" ".join(f"const int {o} = r{d} + {st[d]} * {u};" for d, (o, u) in enumerate(zip(on, un, strict=True)))}
                ok[c] = {" && ".join(f"{o} < {os_[d]}" for d, o in enumerate(on))};
                yo[c] = {horner(on, os_)};"""
    else:
        place = f"""{_unflat_int("j", os_, on)}
                ok[c] = 1;
                yo[c] = j;"""
    lang = L.lang
    if lang == "opencl":
        st4 = "vstore4((float4)(v[c], v[c + 1], v[c + 2], v[c + 3]), 0, &y[yrow + j]);"
    else:
        st4 = "*reinterpret_cast<float4*>(&y[yrow + j]) = make_float4(v[c], v[c + 1], v[c + 2], v[c + 3]);"
    vec_store = (
        ""
        if transposed
        else f"""#if CN >= 4
        if ((({P}) & 3) == 0) {{
            #pragma unroll
            for (int c = 0; c < CN; c += 4) {{
                const int j = j0 + KF_JCOL(c);
                if (j < {P}) {{ {st4} }}
            }}
        }} else
#endif
"""
    )
    store = (
        fold_row
        if pool
        else f"""{vec_store}        {{
            #pragma unroll
            for (int c = 0; c < CN; ++c) if (ok[c]) y[yrow + yo[c]] = v[c];
        }}"""
    )
    text = f"""{_tiles_decl(lang, f"kf_csm{L.nk}")}
    KF_LOCAL int kt[2][{nf}][16];
    const int tx = KF_LID(0), ty = KF_LID(1), tid = ty * 16 + tx;
    const int j0 = (int)KF_GRP(0) * (16 * CN), i0 = (int)KF_GRP(1) * (16 * CM);
    const int bz = (int)KF_GRP(2);
{head}    const kf_long xb = (kf_long)(nb * {cin} + g * {cin_g}) * {xs_flat};
    // a thread loads one patch column (its position decomposed once) at CN taps, 16 / CN apart
    const int bk = tid / (16 * CN), bj = tid - bk * (16 * CN);
    int jok, colb, {", ".join(f"jb{d}" for d in range(nd))};
    {{
        {col}
        colb = {horner([f"jb{d}" for d in range(nd)], xs)};
    }}
{xg_decl}    KF_G const float* wr = {wp} + {w_base};
    if (tid < 16) {{
        const int kfill = 0, kfb = 0;
        {fill}
    }}
    float accv[CM][CN];
    #pragma unroll
    for (int r = 0; r < CM; ++r) {{
        #pragma unroll
        for (int c = 0; c < CN; ++c) accv[r][c] = 0.0f;
    }}
    float ra[CM], rb[CN];
    KF_BARRIER;
    {{
        const int k0 = 0, kbuf = 0;
{load}
    }}
    #pragma unroll
    for (int l = 0; l < CM; ++l) As[0][tx][ty + 16 * l] = ra[l];
    #pragma unroll
    for (int l = 0; l < CN; ++l) Bs[0][bk + l * (16 / CN)][bj] = rb[l];
    if (tid < 16 && 16 < KK) {{
        const int kfill = 16, kfb = 1;
        {fill}
    }}
    KF_BARRIER;
    // step s multiplies tile buffer s & 1 while step s + 1's loads (tap table (s + 1) & 1, filled a
    // step ahead) are in flight; they are stored to the other buffer, last read before the previous
    // barrier, and the tap table of step s + 2 is filled into the one step s used: one barrier a step
    int s = 0;
    for (int k0s = 0; k0s < KK; k0s += 16, ++s) {{
        const int cur = s & 1;
        const int more = k0s + 16 < KK;
        if (more) {{
            const int k0 = k0s + 16, kbuf = cur ^ 1;
{load}
        }}
#if KF_FILL_EARLY
        // the tap table of step s + 2 into the one step s - 1's loads read (before the last barrier): the
        // first warp's integer divisions overlap the other warps' multiply-adds, not the barrier
        if (tid < 16 && k0s + 32 < KK) {{
            const int kfill = k0s + 32, kfb = cur;
            {fill}
        }}
#endif
#if KF_KU == 2
        #pragma unroll 2
#elif KF_KU == 4
        #pragma unroll 4
#elif KF_KU == 8
        #pragma unroll 8
#else
        #pragma unroll
#endif
        for (int kk = 0; kk < 16; ++kk) {{
            float av[CM], bv[CN];
{_vec_read(lang, "av", "As[cur][kk]", "ty * CM", "CM")}
#if CN >= 4
            #pragma unroll
            for (int q = 0; q < CN; q += 4) {{
                {_ld4(lang, "Bs[cur][kk][(q / 4) * 64 + tx * 4]")}
                bv[q] = t4.x; bv[q + 1] = t4.y; bv[q + 2] = t4.z; bv[q + 3] = t4.w;
            }}
#else
{_vec_read(lang, "bv", "Bs[cur][kk]", "tx * CN", "CN")}
#endif
            #pragma unroll
            for (int r = 0; r < CM; ++r) {{
                #pragma unroll
                for (int c = 0; c < CN; ++c) accv[r][c] = KF_CFMA(av[r], bv[c], accv[r][c]);
            }}
        }}
        if (more) {{
            #pragma unroll
            for (int l = 0; l < CM; ++l) As[cur ^ 1][tx][ty + 16 * l] = ra[l];
            #pragma unroll
            for (int l = 0; l < CN; ++l) Bs[cur ^ 1][bk + l * (16 / CN)][bj] = rb[l];
#if !KF_FILL_EARLY
            if (tid < 16 && k0s + 32 < KK) {{
                const int kfill = k0s + 32, kfb = cur;
                {fill}
            }}
#endif
        }}
        KF_BARRIER;
    }}
{fold_head if pool else ""}    #pragma unroll
    for (int r = 0; r < CM; ++r) {{
        const int m = i0 + ty * CM + r;
        if (m >= {cout_g}) continue;
        const int co = g * {cout_g} + m;
        const kf_long yrow = ((kf_long)nb * {cout} + co) * {P};
        float v[CN];
        int ok[CN], yo[CN];
        #pragma unroll
        for (int c = 0; c < CN; ++c) {{
            const int j = j0 + KF_JCOL(c);
            v[c] = 0.0f;
            ok[c] = 0;
            yo[c] = 0;
            if (j < {cols}) {{
                {place}
                if (ok[c]) {{
                    float acc = accv[r][c];{add}
                    v[c] = {epi};
                }}
            }}
        }}
{store}
    }}{fold_tail if pool else ""}"""
    fma = "fmaf((a), (b), (c))" if lang == "cuda" else "((a) * (b) + (c))"
    jcol = (
        "#if CN >= 4\n#define KF_JCOL(c) (((c) / 4) * 64 + tx * 4 + ((c) & 3))\n"
        "#else\n#define KF_JCOL(c) (tx * CN + (c))\n#endif\n"
    )
    defaults = (
        "#ifndef KF_FILL_EARLY\n#define KF_FILL_EARLY 1\n#endif\n#ifndef KF_KU\n#define KF_KU 16\n#endif\n"
    )
    text = f"{defaults}#define KF_CFMA(a, b, c) {fma}\n{jcol}" + text + "\n#undef KF_CFMA\n#undef KF_JCOL"
    nk = L.nk
    if transposed:
        p_py = "*".join(f"_cdiv({py_shape}[{2 + d}], {stride_py[d]})" for d in range(nd))
        z_py = f"{py_shape}[0] * {groups_py} * " + "*".join(stride_py)
    else:
        p_py = "*".join(f"{py_shape}[{2 + d}]" for d in range(nd))
        z_py = f"{py_shape}[0] * {groups_py}"
    cg_py = f"({py_shape}[1] // {groups_py})"
    gx_py = f"_cdiv({p_py}, 16 * p['CN'])"
    launch = f"grid=({gx_py}, _cdiv({cg_py}, 16 * p['CM']), {z_py}), block=(16, 16, 1)"
    parts = None
    if pool:  # the kernel writes a partial sum per (tile, image, channel), not the conv output
        tiles_py = gx_py + "".join(f" * {s_}" for s_ in stride_py) if transposed else gx_py
        text = text.replace("KF_NGRP0", L.sym(gx_py)).replace("KF_NTILES", L.sym(tiles_py))
        parts = lower_conv_pool.partials_val(
            L, pool[0], pool[1], nd, f"b{nk}", py_shape, tiles_py, fold_lanes
        )
        L.fwd(f"b{nk} = torch.empty({parts[0].py_shape}, dtype=torch.float32, device=dev)")
    else:
        L.fwd(f"b{nk} = torch.empty({py_shape}, dtype=torch.float32, device=dev)")
    rows, positions, batch = out[1] // groups, math.prod(out[2:]), out[0] * groups
    if transposed and nd >= 2 and _tiles(rows, positions, batch, 8, 16) < MIN_WIDE_TILES:
        # 128 x 64 tiles take 130 registers here (one 256-thread block per SM); 128 x 256 ones (one
        # block per SM anyway) 253, no spills
        rows = min(rows, 96)
    L.conv_sizes.append((rows, positions, batch))
    if lang == "cuda":  # the 128 x 256 tiles in dynamic shared memory (SMEM_PY)
        launch += f", shared_mem={SMEM_PY}"
    name = L.kernel(text, ctype, "", "convgemm", launch_dims=launch)
    k = L.sched.kernels[-1]
    if lang == "cuda":
        k.source = k.source.replace(f"KF_KERNEL {k.name}(", f"KF_KERNEL KF_CONV_BOUNDS {k.name}(", 1)
        k.source = CONV_BOUNDS + k.source
    L.fwd(k.launch)
    if pool and parts is not None:  # the reduction folds the partials (the conv's value is never read)
        lower_conv_pool.finish(L, pool[0], *parts, pool[2], P)
    return L.buffer_val(name, out, py_shape, ctype)


#: Output rows per work item of the depthwise stencil (a vertical strip: the input rows its taps share are
#: loaded once); the largest window unrolled at generation time.
DW_ROWS = 4
DW_MAX_TAPS = 49


def depthwise_static(mod: object) -> tuple[tuple[int, int], ...] | None:
    """((KH, KW), stride, padding, dilation) of a 2-D depthwise convolution module (one input channel
    per group), where they are ints that the stencil unrolls; else None."""
    ks, st, pd, dl = (getattr(mod, a, None) for a in ("kernel_size", "stride", "padding", "dilation"))
    parts = []
    for v in (ks, st, pd, dl):
        if not isinstance(v, tuple) or len(v) != 2 or not all(isinstance(k, int) and k >= 0 for k in v):
            return None
        parts.append((int(v[0]), int(v[1])))
    if parts[0][0] * parts[0][1] > DW_MAX_TAPS or min(parts[1]) < 1 or min(parts[3]) < 1:
        return None
    return tuple(parts)


def emit_conv_depthwise(
    L: Lowering,
    node: fx.Node,
    x: Val,
    w: Val,
    bias: str | None,
    geometry: tuple[list[str], list[str], list[str], str],
    static: tuple[tuple[int, int], ...],
    out: tuple[int, ...],
    py_shape: str,
) -> Val:
    """A 2-D depthwise convolution (one input channel per group, any channel multiplier) as a stencil: a
    work-group per (image, output channel) plane tile of 32 x 8 work items, each a vertical strip of
    ``DW_ROWS`` outputs of one column. Where the runtime geometry is ``static`` (the module's at
    generation time) the window is unrolled: each input row the strip's taps share is loaded once (its
    ``KW`` taps in flight together) and the filter is held in registers; elsewhere generic loops. The
    anchor's elementwise epilogue is applied on store."""
    st, pd, dl, _ = geometry
    odims = L.shape_dims(py_shape, out)
    cin, cout = x.dims[1], odims[1]
    ih_, iw_ = x.dims[2], x.dims[3]
    oh_, ow_ = odims[2], odims[3]
    kh_, kw_ = w.dims[2], w.dims[3]
    (KH, KW), (SH, SW), (PH, PW), (DH, DW) = static
    R = DW_ROWS
    wp = L.ptr(str(w.buffer))
    mult = f"({cout} / {cin})"
    if x.buffer is not None:
        xp = L.ptr(x.buffer)

        def xload(ih: str, iw: str) -> str:
            return f"{xp}[xb + (kf_long)({ih}) * {iw_} + ({iw})]"
    else:

        def xload(ih: str, iw: str) -> str:
            return x.load(["(kf_long)nb", "(kf_long)ci", f"(kf_long)({ih})", f"(kf_long)({iw})"])

    # the unrolled strip: input row q of the span feeds output row r at tap i where q = r * SH + i * DH
    span = (R - 1) * SH + (KH - 1) * DH + 1
    lines = [f"const float wk{t} = {wp}[wb + {t}];" for t in range(KH * KW)]
    lines.append(" ".join(f"float a{r} = 0.0f;" for r in range(R)))
    lines.append(" ".join(f"const int iw{j} = ow * {SW} - {PW} + {j * DW};" for j in range(KW)))
    lines.append(" ".join(f"const int cw{j} = iw{j} >= 0 && iw{j} < {iw_};" for j in range(KW)))
    for q in range(span):
        uses = [(r, (q - r * SH) // DH) for r in range(R) if q >= r * SH and (q - r * SH) % DH == 0]
        uses = [(r, i) for r, i in uses if i < KH]
        if not uses:
            continue
        rows_ok = " || ".join(f"{r} < nr" for r, _ in uses)
        lines.append(f"{{ const int ih = ih0 + {q}; const int rok = ih >= 0 && ih < {ih_} && ({rows_ok});")
        for j in range(KW):
            lines.append(f"  const float v{j} = (rok && cw{j}) ? {xload('ih', f'iw{j}')} : 0.0f;")
        for r, i in uses:
            terms = " ".join(f"a{r} = KF_DFMA(v{j}, wk{i * KW + j}, a{r});" for j in range(KW))
            lines.append(f"  {terms}")
        lines.append("}")
    unrolled = "\n        ".join(lines)
    # the generic strip: runtime window, one output row at a time
    generic = f"""float a[{R}];
        #pragma unroll
        for (int r = 0; r < {R}; ++r) {{
            float acc = 0.0f;
            for (int i = 0; i < {kh_}; ++i) {{
                const int ih = (oh0 + r) * {st[0]} - {pd[0]} + i * {dl[0]};
                if (ih < 0 || ih >= {ih_}) continue;
                for (int j = 0; j < {kw_}; ++j) {{
                    const int iw = ow * {st[1]} - {pd[1]} + j * {dl[1]};
                    if (iw >= 0 && iw < {iw_}) acc = KF_DFMA({xload("ih", "iw")}, {wp}[wb + i * {kw_} + j], acc);
                }}
            }}
            a[r] = acc;
        }}"""
    fits = " && ".join(
        f"{a} == {b}"
        for a, b in zip(
            [kh_, kw_, st[0], st[1], pd[0], pd[1], dl[0], dl[1]],
            [KH, KW, SH, SW, PH, PW, DH, DW],
            strict=True,
        )
    )
    cs = ["(kf_long)nb", "(kf_long)co", "(kf_long)oh", "(kf_long)ow"]
    epi, ctype, _ = L.epilogue(node, out, cs, "float")
    add = f" acc += {bias}[co];" if bias else ""
    stores_u = "\n        ".join(
        f"if ({r} < nr) {{ const int oh = oh0 + {r}; float acc = a{r};{add} y[yb + (kf_long)oh * {ow_} + ow] = {epi}; }}"
        for r in range(R)
    )
    stores_g = f"""#pragma unroll
        for (int r = 0; r < {R}; ++r)
            if (r < nr) {{ const int oh = oh0 + r; float acc = a[r];{add} y[yb + (kf_long)oh * {ow_} + ow] = {epi}; }}"""
    fma = "fmaf((a), (b), (c))" if L.lang == "cuda" else "((a) * (b) + (c))"
    text = f"""#define KF_DFMA(a, b, c) {fma}
    const int ow = (int)KF_GRP(0) * 32 + KF_LID(0);
    const int oh0 = ((int)KF_GRP(1) * 8 + KF_LID(1)) * {R};
    const int plane = (int)KF_GRP(2), nb = plane / {cout}, co = plane - nb * {cout}, ci = co / {mult};
    if (ow < {ow_} && oh0 < {oh_}) {{
    const int nr = {oh_} - oh0;
    const kf_long xb = ((kf_long)nb * {cin} + ci) * ((kf_long){ih_} * {iw_});
    const kf_long yb = (kf_long)plane * ((kf_long){oh_} * {ow_});
    const int wb = co * ({kh_} * {kw_});
    if ({fits}) {{
        const int ih0 = oh0 * {SH} - {PH};
        {unrolled}
        {stores_u}
    }} else {{
        {generic}
        {stores_g}
    }}
    }}
#undef KF_DFMA"""
    nk = L.nk
    L.fwd(f"b{nk} = torch.empty({py_shape}, dtype=torch.float32, device=dev)")
    launch = (
        f"grid=(_cdiv({py_shape}[3], 32), _cdiv({py_shape}[2], {8 * R}), {py_shape}[0] * {py_shape}[1]), "
        "block=(32, 8, 1)"
    )
    name = L.kernel(text, ctype, "", "dwconv", launch_dims=launch)
    L.fwd(L.sched.kernels[-1].launch)
    return L.buffer_val(name, out, py_shape, ctype)
