"""Convolution as an implicit GEMM (the fused schedules of :mod:`.lower`).

For one image ``nb`` and one group ``g`` the output is the product of an ``M x K`` filter matrix
(``M`` = output channels of the group, ``K`` = input channels of the group times the kernel's taps)
and a ``K x P`` patch matrix (``P`` = output positions) that is never built: each 16-deep step of K
gathers its patch tile from the input into local memory (zero where the tap falls in the padding or,
transposed, between the strided input positions) and its filter tile beside it. 16 x 16 threads each
hold a CM x CN register block of a 16CM x 16CN output tile; the next step's loads are in registers
while this step multiplies. The position of a thread's patch columns is decomposed once, outside the
K loop, in 32-bit arithmetic. The output is written where it lies in the NC... layout, with the
anchor's elementwise epilogue applied on store.

A transposed convolution is the same product over its output positions (the gradient-style gather:
input position ``(o + pad - k * dil) / stride`` where that divides exactly); grouped and depthwise
convolutions take the group from the grid's third axis.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline.lower import Val, horner

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering

#: Smallest output channels per group worth a GEMM tile; below it the direct kernel is kept.
MIN_ROWS = 4


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
) -> Val:
    """The implicit-GEMM kernel of convolution ``node`` (``geometry``: stride, padding, dilation C
    names per spatial dim and the group count's); ``out`` is its traced output shape."""
    st, pd, dl, G = geometry
    nd = len(out) - 2
    odims = L.shape_dims(py_shape, out)
    xs, os_, ks = x.dims[2:], odims[2:], w.dims[2:]
    cin, cout = x.dims[1], odims[1]
    P, KV = _prod(os_), _prod(ks)
    if transposed:
        cin_g, cout_g = f"({cin} / {G})", w.dims[1]
    else:
        cin_g, cout_g = w.dims[1], f"({cout} / {G})"
    K = f"({cin_g} * {KV})"
    wp = L.ptr(str(w.buffer))
    xs_flat = _prod(xs)
    knames = [f"t{d}" for d in range(nd)]
    # the tap table of a 16-deep step of K: ci, ci's and the taps' input offset, each tap's displacement
    nf = 2 + nd
    kd = [f"kt[kbuf][{2 + d}][{{e}}]" for d in range(nd)]
    invalid = "0x40000000" if transposed else "(-0x40000000)"
    fill = f"""{{
            const int e = tid, kq = kfill + e;
            const int ci = kq / {KV}; const int r = kq - ci * {KV};
            {_unflat_int("r", ks, knames)}
            kt[kfb][0][e] = ci;
            kt[kfb][1][e] = ci * {xs_flat} + {horner([f"{t} * {dl[d]}" for d, t in enumerate(knames)], xs)};
{"".join(f"            kt[kfb][{2 + d}][e] = {t} * {dl[d]};{chr(10)}" for d, t in enumerate(knames))}\
            if (kq >= {K}) kt[kfb][2][e] = {invalid};
        }}"""
    # filter element (m, ka) of group g (``kbuf``'s table entry ``tx`` describes ka = k0 + tx)
    if transposed:
        a_load = f"{wp}[((kf_long)(g * {cin_g} + kt[kbuf][0][tx]) * {cout_g} + m) * {KV} + ka - kt[kbuf][0][tx] * {KV}]"
    else:
        a_load = f"{wp}[(kf_long)(g * {cout_g} + m) * {K} + ka]"
    onames = [f"o{d}" for d in range(nd)]
    base = [f"{o} + {pd[d]}" if transposed else f"{o} * {st[d]} - {pd[d]}" for d, o in enumerate(onames)]
    ent = [k.format(e="kr") for k in kd]
    chan = f"(g * {cin_g} + kt[kbuf][0][kr])"
    if transposed:
        ts = [f"(jb{d} - {ent[d]})" for d in range(nd)]
        checks = " && ".join(
            f"{t} >= 0 && {t} % {st[d]} == 0 && {t} / {st[d]} < {xs[d]}" for d, t in enumerate(ts)
        )
        pos = [f"({t} / {st[d]})" for d, t in enumerate(ts)]
    else:
        pos = [f"(jb{d} + {ent[d]})" for d in range(nd)]
        checks = " && ".join(f"{p} >= 0 && {p} < {xs[d]}" for d, p in enumerate(pos))
    if x.buffer is not None:
        xp = L.ptr(x.buffer)
        if transposed:
            x_load = f"{xp}[(kf_long)(nb * {cin} + {chan}) * {xs_flat} + {horner(pos, xs)}]"
        else:  # the column's base offset plus the tap's
            x_load = f"{xp}[xb + colb + kt[kbuf][1][kr]]"
    else:  # a prologue-fused value: its loader at the (64-bit) coordinates
        x_load = x.load(["(kf_long)nb", f"(kf_long){chan}", *[f"(kf_long){p}" for p in pos]])
    load = f"""        #pragma unroll
        for (int l = 0; l < CM; ++l) {{
            const int m = i0 + ty + 16 * l, ka = k0 + tx;
            ra[l] = (m < {cout_g} && ka < {K}) ? {a_load} : 0.0f;
        }}
        #pragma unroll
        for (int l = 0; l < CN; ++l) {{
            const int kr = bk + l * (16 / CN);
            rb[l] = (jok && ({checks})) ? {x_load} : 0.0f;
        }}"""
    cs = ["(kf_long)nb", "(kf_long)co", *[f"(kf_long){o}" for o in onames]]
    epi, ctype, _ = L.epilogue(node, out, cs, "float")
    add = f" acc += {bias}[co];" if bias else ""
    jdecomp = _unflat_int("j", os_, onames)
    hoist_set = " ".join(f"jb{d} = {base[d]};" for d in range(nd))
    lang = L.lang
    if lang == "opencl":
        st4 = "vstore4((float4)(v[c], v[c + 1], v[c + 2], v[c + 3]), 0, &y[yrow + j]);"
    else:
        st4 = "*reinterpret_cast<float4*>(&y[yrow + j]) = make_float4(v[c], v[c + 1], v[c + 2], v[c + 3]);"
    text = f"""    KF_LOCAL float As[16][16 * CM + 4];
    KF_LOCAL float Bs[16][16 * CN + 4];
    KF_LOCAL int kt[2][{nf}][16];
    const int tx = KF_LID(0), ty = KF_LID(1), tid = ty * 16 + tx;
    const int j0 = (int)KF_GRP(0) * (16 * CN), i0 = (int)KF_GRP(1) * (16 * CM);
    const int bz = (int)KF_GRP(2), nb = bz / {G}, g = bz - nb * {G};
    const kf_long xb = (kf_long)(nb * {cin} + g * {cin_g}) * {xs_flat};
    // a thread loads one patch column (its position decomposed once) at CN taps, 16 / CN apart
    const int bk = tid / (16 * CN), bj = tid - bk * (16 * CN);
    const int jok = j0 + bj < {P};
    int colb, {", ".join(f"jb{d}" for d in range(nd))};
    {{
        const int j = j0 + bj;
        {jdecomp}
        {hoist_set}
        colb = {horner([f"jb{d}" for d in range(nd)], xs)};
    }}
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
    int s = 0;
    for (int k0s = 0; k0s < {K}; k0s += 16, ++s) {{
        #pragma unroll
        for (int l = 0; l < CM; ++l) As[tx][ty + 16 * l] = ra[l];
        #pragma unroll
        for (int l = 0; l < CN; ++l) Bs[bk + l * (16 / CN)][bj] = rb[l];
        if (tid < 16 && k0s + 16 < {K}) {{
            const int kfill = k0s + 16, kfb = (s + 1) & 1;
            {fill}
        }}
        KF_BARRIER;
        if (k0s + 16 < {K}) {{
            const int k0 = k0s + 16, kbuf = (s + 1) & 1;
{load}
        }}
        #pragma unroll
        for (int kk = 0; kk < 16; ++kk) {{
            float av[CM], bv[CN];
{_vec_read(lang, "av", "As[kk]", "ty * CM", "CM")}
#if CN >= 4
            #pragma unroll
            for (int q = 0; q < CN; q += 4) {{
                {_ld4(lang, "Bs[kk][(q / 4) * 64 + tx * 4]")}
                bv[q] = t4.x; bv[q + 1] = t4.y; bv[q + 2] = t4.z; bv[q + 3] = t4.w;
            }}
#else
{_vec_read(lang, "bv", "Bs[kk]", "tx * CN", "CN")}
#endif
            #pragma unroll
            for (int r = 0; r < CM; ++r) {{
                #pragma unroll
                for (int c = 0; c < CN; ++c) accv[r][c] = KF_CFMA(av[r], bv[c], accv[r][c]);
            }}
        }}
        KF_BARRIER;
    }}
    #pragma unroll
    for (int r = 0; r < CM; ++r) {{
        const int m = i0 + ty * CM + r;
        if (m >= {cout_g}) continue;
        const int co = g * {cout_g} + m;
        const kf_long yrow = ((kf_long)nb * {cout} + co) * {P};
        float v[CN];
        #pragma unroll
        for (int c = 0; c < CN; ++c) {{
            const int j = j0 + KF_JCOL(c);
            v[c] = 0.0f;
            if (j < {P}) {{
                {jdecomp}
                float acc = accv[r][c];{add}
                v[c] = {epi};
            }}
        }}
#if CN >= 4
        if ((({P}) & 3) == 0) {{
            #pragma unroll
            for (int c = 0; c < CN; c += 4) {{
                const int j = j0 + KF_JCOL(c);
                if (j < {P}) {{ {st4} }}
            }}
        }} else
#endif
        {{
            #pragma unroll
            for (int c = 0; c < CN; ++c) {{
                const int j = j0 + KF_JCOL(c);
                if (j < {P}) y[yrow + j] = v[c];
            }}
        }}
    }}"""
    jcol = "#if CN >= 4\n#define KF_JCOL(c) (((c) / 4) * 64 + tx * 4 + ((c) & 3))\n#else\n#define KF_JCOL(c) (tx * CN + (c))\n#endif\n"
    fma = "fmaf((a), (b), (c))" if lang == "cuda" else "((a) * (b) + (c))"
    text = f"#define KF_CFMA(a, b, c) {fma}\n{jcol}" + text + "\n#undef KF_CFMA\n#undef KF_JCOL"
    nk = L.nk
    L.fwd(f"b{nk} = torch.empty({py_shape}, dtype=torch.float32, device=dev)")
    p_py = "*".join(f"{py_shape}[{2 + d}]" for d in range(nd)) or "1"
    cg_py = f"({py_shape}[1] // {groups_py})"
    launch = (
        f"grid=(_cdiv({p_py}, 16 * p['CN']), _cdiv({cg_py}, 16 * p['CM']), "
        f"{py_shape}[0] * {groups_py}), block=(16, 16, 1)"
    )
    L.conv_sizes.append((out[1] // groups, math.prod(out[2:]), out[0] * groups))
    name = L.kernel(text, ctype, "", "convgemm", launch_dims=launch)
    L.fwd(L.sched.kernels[-1].launch)
    return L.buffer_val(name, out, py_shape, ctype)
