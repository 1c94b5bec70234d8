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
    # filter element (m, k) of group g
    if transposed:
        a_load = f"{wp}[((kf_long)(g * {cin_g} + ka / {KV}) * {cout_g} + m) * {KV} + ka % {KV}]"
    else:
        a_load = f"{wp}[(kf_long)(g * {cout_g} + m) * {K} + ka]"
    # per-column hoisted base positions, then per tap the input position and its validity
    onames = [f"o{d}" for d in range(nd)]
    hoist = [f"jb{d}[l]" for d in range(nd)]
    if transposed:
        base = [f"{onames[d]} + {pd[d]}" for d in range(nd)]
    else:
        base = [f"{onames[d]} * {st[d]} - {pd[d]}" for d in range(nd)]
    knames = [f"t{d}" for d in range(nd)]
    pos, checks = [], []
    for d in range(nd):
        t = f"({hoist[d]} - {knames[d]} * {dl[d]})" if transposed else f"({hoist[d]} + {knames[d]} * {dl[d]})"
        if transposed:
            pos.append(f"({t} / {st[d]})")
            checks.append(f"{t} >= 0 && {t} % {st[d]} == 0 && {t} / {st[d]} < {xs[d]}")
        else:
            pos.append(t)
            checks.append(f"{t} >= 0 && {t} < {xs[d]}")
    chan = f"(g * {cin_g} + ci)"
    if x.buffer is not None:
        xp = L.ptr(x.buffer)
        x_load = f"{xp}[(kf_long)(nb * {cin} + {chan}) * {_prod(xs)} + {horner(pos, xs)}]"
    else:  # a prologue-fused value: its loader at the (64-bit) coordinates
        x_load = x.load(["(kf_long)nb", f"(kf_long){chan}", *[f"(kf_long){p}" for p in pos]])
    tap = _unflat_int("r", ks, knames)
    b_load = f"""        #pragma unroll
        for (int l = 0; l < CN; ++l) {{
            const int kb = k0 + bk[l];
            float v = 0.0f;
            if (jok[l] && kb < {K}) {{
                const int ci = kb / {KV}; const int r = kb - ci * {KV};
                {tap}
                if ({" && ".join(checks)}) v = {x_load};
            }}
            rb[l] = v;
        }}"""
    load = f"""        #pragma unroll
        for (int l = 0; l < CM; ++l) {{
            const int m = i0 + ty + 16 * l, ka = k0 + tx;
            ra[l] = (m < {cout_g} && ka < {K}) ? {a_load} : 0.0f;
        }}
{b_load}"""
    cs = ["(kf_long)nb", "(kf_long)co", *[f"(kf_long){o}" for o in onames]]
    epi, ctype, _ = L.epilogue(node, out, cs, "float")
    add = f" acc += {bias}[co];" if bias else ""
    jdecomp = _unflat_int("j", os_, onames)
    hoist_set = " ".join(f"jb{d}[l] = {base[d]};" for d in range(nd))
    lang = L.lang
    text = f"""    KF_LOCAL float As[16][16 * CM + 4];
    KF_LOCAL float Bs[16][16 * CN + 4];
    const int tx = KF_LID(0), ty = KF_LID(1), tid = ty * 16 + tx;
    const int j0 = (int)KF_GRP(0) * (16 * CN), i0 = (int)KF_GRP(1) * (16 * CM);
    const int bz = (int)KF_GRP(2), nb = bz / {G}, g = bz - nb * {G};
    int bk[CN], bj[CN], jok[CN];
{"".join(f"    int jb{d}[CN];{chr(10)}" for d in range(nd))}    #pragma unroll
    for (int l = 0; l < CN; ++l) {{
        const int e = tid + 256 * l;
        bk[l] = e / (16 * CN); bj[l] = e - bk[l] * (16 * CN);
        const int j = j0 + bj[l];
        jok[l] = j < {P};
        {jdecomp}
        {hoist_set}
    }}
    float accv[CM][CN];
    #pragma unroll
    for (int r = 0; r < CM; ++r) {{
        #pragma unroll
        for (int c = 0; c < CN; ++c) accv[r][c] = 0.0f;
    }}
    float ra[CM], rb[CN];
    {{
        const int k0 = 0;
{load}
    }}
    for (int k0s = 0; k0s < {K}; k0s += 16) {{
        #pragma unroll
        for (int l = 0; l < CM; ++l) As[tx][ty + 16 * l] = ra[l];
        #pragma unroll
        for (int l = 0; l < CN; ++l) Bs[bk[l]][bj[l]] = rb[l];
        KF_BARRIER;
        if (k0s + 16 < {K}) {{
            const int k0 = k0s + 16;
{load}
        }}
        #pragma unroll
        for (int kk = 0; kk < 16; ++kk) {{
            float av[CM], bv[CN];
{_vec_read(lang, "av", "As[kk]", "ty * CM", "CM")}
{_vec_read(lang, "bv", "Bs[kk]", "tx * CN", "CN")}
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
        #pragma unroll
        for (int c = 0; c < CN; ++c) {{
            const int j = j0 + tx * CN + c;
            if (j < {P}) {{
                {jdecomp}
                float acc = accv[r][c];{add}
                y[((kf_long)nb * {cout} + co) * {P} + j] = {epi};
            }}
        }}
    }}"""
    fma = "fmaf((a), (b), (c))" if lang == "cuda" else "((a) * (b) + (c))"
    text = f"#define KF_CFMA(a, b, c) {fma}\n" + text + "\n#undef KF_CFMA"
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
