"""Warp-tiled matrix products of the cooperative graph schedule (:meth:`.Lowering.emit_tiled_mm`).

The tiling of ``matmul/sgemm_warp`` (:mod:`.cookbook_sgemm_warp`): a BM x BN output tile per block of
NT = (BM / WM) * (BN / WN) * 32 threads, K in steps of BK; a warp owns a WM x WN tile whose lanes are
LR x LC = (WM / TM) x (WN / TN), each holding TM / 4 strips of 4 rows (LR * 4 rows apart) and TN / 4 strips
of 4 columns (LC * 4 apart), read as float4s from shared memory. A is stored transposed (``As[k][m]``,
stride BM + 4); B as ``Bs[k][n]`` (stride BN + 4 where B is read along K, a linear layer's weight). Both
tiles are double-buffered; the next step's global loads are held in registers while this step
multiplies, then stored into the other buffer: one barrier per step.

The operands come through the lowering's load callbacks (any index expression, prologues fused): every
load is one element, predicated on M, N and K (zero fill), neighbouring threads reading neighbouring
elements along K (A, and B in the ``lintile`` layouts) or along N (B otherwise). The node's elementwise
epilogue is applied on store. On CUDA the tiles live in dynamic shared memory (the default tile's 49 KB
is past the 48 KB of static shared memory); on OpenCL (PoCL: the schedule's logic) in a local array.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.fx as fx

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering, Val

#: marker of the warp-tiled schedule in a kernel's text
MARKER = "kf_warp_mm"

#: the fewest output tiles (over the batch) for which a tile size is taken: one per SM of an H200
#: (tests set 0 to take the warp tiles at small shapes)
MIN_TILES = 132

#: block groups of SWZ tile rows (A's rows stay in L2 across a group), as sgemm_warp's default
SWZ = 8


@dataclass(frozen=True)
class Tile:
    """Block tile BM x BN x BK, warp tile WM x WN, thread tile TM x TN."""

    BM: int
    BN: int
    BK: int
    WM: int
    WN: int
    TM: int
    TN: int

    @property
    def nt(self) -> int:
        return (self.BM // self.WM) * (self.BN // self.WN) * 32


#: sgemm_warp's default (128 x 256 x 16, eight 64 x 64 warps of 16 x 8; 0.90-0.94x cuBLAS at 4096^3 on
#: the H200), then its 128 x 128 tiles of 16 x 8 (four warps; 0.85-0.87x) for products with fewer tiles,
#: then 128 x 64 tiles (four 64 x 32 warps of 16 x 4) for narrow products (attention's P @ V with a head of
#: 64: a 256-wide tile would compute four times the outputs it keeps)
TILES = (
    Tile(128, 256, 16, 64, 64, 16, 8),
    Tile(128, 128, 16, 64, 64, 16, 8),
    Tile(128, 64, 16, 64, 32, 16, 4),
)

#: a tile is taken only if it keeps at least this share of the best useful share (outputs kept over
#: outputs computed) among the tiles that fill the GPU
WASTE_SLACK = 0.85


def pick(out: tuple[int, ...], nbatch: int, min_tiles: int | None = None) -> Tile | None:
    """The first of :data:`TILES` giving the traced product at least ``min_tiles`` tiles and within
    :data:`WASTE_SLACK` of the least padded of those; None: no tile gives enough."""
    need = MIN_TILES if min_tiles is None else min_tiles
    if len(out) < 2:
        return None
    batch = math.prod(out[:nbatch])
    m, n = math.prod(out[nbatch:-1]), out[-1]

    def tiles(t: Tile) -> int:
        return batch * -(-m // t.BM) * -(-n // t.BN)

    fit = [t for t in TILES if tiles(t) >= need]
    if not fit:
        return None
    useful = {t: m * n * batch / (tiles(t) * t.BM * t.BN) for t in fit}
    best = max(useful.values())
    return next(t for t in fit if useful[t] >= WASTE_SLACK * best)


def vector_run(expr: str, var: str, start: str, floats: set[str]) -> str | None:
    """The address of the element of ``expr`` at ``var = start`` where ``expr`` reads a float buffer (of
    ``floats``) at an index ending in ``+ (var)`` (elements ``start .. start + 3`` then lie side by side);
    None otherwise (another layout, a conversion, a fused prologue)."""
    m = re.fullmatch(rf"(buf\d+)\[\((.*) \+ \({var}\)\)\]", expr.strip())
    if m is None or m.group(1) not in floats or re.search(rf"\b{var}\b", m.group(2)):
        return None
    return f"{m.group(1)} + ({m.group(2)} + ({start}))"


def _run(lang: str, dst: str, expr: str, var: str, start: str, ok: str, bound: str, floats: set[str]) -> str:
    """Statements setting ``dst[4 * l + u]`` (u = 0..3) to ``expr`` at ``var = start + u`` (zero where
    ``ok`` fails or ``var`` reaches ``bound``): one 16-byte load where the run is a float buffer's, in
    bounds and aligned (sgemm_warp's LDG.128), four predicated loads otherwise."""
    scalar = f"""for (int u = 0; u < 4; ++u) {{
                const kf_long {var} = {start} + u;
                {dst}[4 * l + u] = ({ok} && {var} < {bound}) ? ({expr}) : 0.0f;
            }}"""
    addr = vector_run(expr, var, start, floats)
    if addr is None:
        return "#pragma unroll\n            " + scalar
    if lang == "cuda":
        aligned, ld = (
            "(reinterpret_cast<size_t>(kf_pv) & 15) == 0",
            "__ldg(reinterpret_cast<const float4*>(kf_pv))",
        )
    else:
        aligned, ld = "((ulong)kf_pv & 15) == 0", "vload4(0, kf_pv)"
    d = f"{dst}[4 * l"
    return f"""const KF_G float* kf_pv = {addr};
            if ({ok} && {start} + 3 < {bound} && {aligned}) {{
                const float4 kf_v = {ld};
                {d}] = kf_v.x; {d} + 1] = kf_v.y; {d} + 2] = kf_v.z; {d} + 3] = kf_v.w;
            }} else {{
                #pragma unroll
                {scalar}
            }}"""


def _loads(
    t: Tile, lang: str, a: str, b: str, kfast: bool, sizes: tuple[str, str, str], floats: set[str]
) -> str:
    """Statements loading the step at ``k0`` into ``ga`` / ``gb`` (a, b: the element expressions of
    ``(i, ka)`` and ``(kb, j)``): each thread runs of 4 consecutive elements along K (A; B where ``kfast``)
    or along N (B otherwise), sgemm_warp's float4s (:func:`_run`)."""
    M, N, K = sizes
    ea, eb, kq = t.BM * t.BK // 4 // t.nt, t.BN * t.BK // 4 // t.nt, t.BK // 4
    if kfast:
        bmap = f"const int r = e / {kq}, q = (e % {kq}) * 4; const kf_long j = j0 + r, kb0 = k0 + q;"
        brun = _run(lang, "gb", b, "kb", "kb0", f"(j < {N})", K, floats)
    else:
        nq = t.BN // 4
        bmap = f"const int r = e / {nq}, q = (e % {nq}) * 4; const kf_long kb = k0 + r, jq = j0 + q;"
        brun = _run(lang, "gb", b, "j", "jq", f"(kb < {K})", N, floats)
    arun = _run(lang, "ga", a, "ka", "ka0", f"(i < {M})", K, floats)
    return f"""        #pragma unroll
        for (int l = 0; l < {ea}; ++l) {{
            const int e = tid + {t.nt} * l, r = e / {kq}, q = (e % {kq}) * 4;
            const kf_long i = i0 + r, ka0 = k0 + q;
            {arun}
        }}
        #pragma unroll
        for (int l = 0; l < {eb}; ++l) {{
            const int e = tid + {t.nt} * l;
            {bmap}
            {brun}
        }}"""


def _stash(t: Tile, kfast: bool, sa: int, sb: int) -> str:
    """Statements storing ``ga`` / ``gb`` into buffer ``s`` (A transposed; B transposed where ``kfast``)."""
    ea, eb, kq = t.BM * t.BK // 4 // t.nt, t.BN * t.BK // 4 // t.nt, t.BK // 4
    bst = f"bs[(q + u) * {sb} + r]" if kfast else f"bs[r * {sb} + q + u]"
    bdiv = kq if kfast else t.BN // 4
    return f"""        #pragma unroll
        for (int l = 0; l < {ea}; ++l) {{
            const int e = tid + {t.nt} * l, r = e / {kq}, q = (e % {kq}) * 4;
            #pragma unroll
            for (int u = 0; u < 4; ++u) as[(q + u) * {sa} + r] = ga[4 * l + u];
        }}
        #pragma unroll
        for (int l = 0; l < {eb}; ++l) {{
            const int e = tid + {t.nt} * l, r = e / {bdiv}, q = (e % {bdiv}) * 4;
            #pragma unroll
            for (int u = 0; u < 4; ++u) {bst} = gb[4 * l + u];
        }}"""


def body(
    t: Tile,
    lang: str,
    smem: str,
    decl: str,
    sizes: tuple[str, str, str],
    a: str,
    b: str,
    kfast: bool,
    store: str,
    floats: set[str],
) -> str:
    """The kernel body of tile ``t`` in ``lang``; ``smem`` names the shared array, ``decl`` declares the
    batch coordinates from ``bz``, ``store`` writes ``acc`` at ``(i, j)`` (bounds checked by the caller),
    ``floats`` the float buffers whose runs may be read as float4s."""
    M, N, K = sizes
    sa, sb = t.BM + 4, t.BN + (4 if kfast else 0)
    words = 2 * t.BK * (sa + sb)
    loc, ngx, ngy = (
        ("", "gridDim.x", "gridDim.y")
        if lang == "cuda"
        else ("__local ", "get_num_groups(0)", "get_num_groups(1)")
    )
    shared = (
        f"extern __shared__ __align__(16) float {smem}[];"
        if lang == "cuda"
        else f"__local float {smem}[{words}];"
    )
    lr, lc = t.WM // t.TM, t.WN // t.TN
    loads = _loads(t, lang, a, b, kfast, sizes, floats)
    frag = f"""            float ra[{t.TM}], rv[{t.TN}];
            #pragma unroll
            for (int r = 0; r < {t.TM // 4}; ++r) {{
                const float4 x = KF_LD4(as + kk * {sa} + r * {lr * 4});
                ra[4 * r] = x.x; ra[4 * r + 1] = x.y; ra[4 * r + 2] = x.z; ra[4 * r + 3] = x.w;
            }}
            #pragma unroll
            for (int c = 0; c < {t.TN // 4}; ++c) {{
                const float4 x = KF_LD4(bs + kk * {sb} + c * {lc * 4});
                rv[4 * c] = x.x; rv[4 * c + 1] = x.y; rv[4 * c + 2] = x.z; rv[4 * c + 3] = x.w;
            }}"""
    return f"""    // {MARKER}: {t.BM} x {t.BN} x {t.BK} tiles, {t.WM} x {t.WN} warps of {t.TM} x {t.TN}
    {shared}
    const int tid = KF_LID(0), warp = tid >> 5, lane = tid & 31;
    const int rb = (warp / {t.BN // t.WN}) * {t.WM} + (lane / {lc}) * 4;
    const int cb = (warp % {t.BN // t.WN}) * {t.WN} + (lane % {lc}) * 4;
    kf_long bx = KF_GRP(0), by = KF_GRP(1);
    {{  // groups of {SWZ} tile rows
        const kf_long gx = {ngx}, gy = {ngy}, pid = by * gx + bx, span = {SWZ} * gx;
        const kf_long first = (pid / span) * {SWZ}, rows = gy - first < {SWZ} ? gy - first : {SWZ};
        by = first + (pid % span) % rows;
        bx = (pid % span) / rows;
    }}
    const kf_long i0 = by * {t.BM}, j0 = bx * {t.BN}, bz = KF_GRP(2);
{decl}    float ga[{t.BM * t.BK // t.nt}], gb[{t.BN * t.BK // t.nt}];
    float accv[{t.TM}][{t.TN}];
    #pragma unroll
    for (int r = 0; r < {t.TM}; ++r) {{
        #pragma unroll
        for (int c = 0; c < {t.TN}; ++c) accv[r][c] = 0.0f;
    }}
    {{
        const kf_long k0 = 0;
{loads}
        {loc}float* as = {smem};
        {loc}float* bs = {smem} + {2 * t.BK * sa};
{_stash(t, kfast, sa, sb)}
    }}
    KF_BARRIER;
    int cur = 0;
    for (kf_long k0s = 0; k0s < (kf_long)({K}); k0s += {t.BK}) {{
        const bool more = k0s + {t.BK} < (kf_long)({K});
        if (more) {{
            const kf_long k0 = k0s + {t.BK};
{loads}
        }}
        {{
        const {loc}float* as = {smem} + cur * {t.BK * sa} + rb;
        const {loc}float* bs = {smem} + {2 * t.BK * sa} + cur * {t.BK * sb} + cb;
        #pragma unroll
        for (int kk = 0; kk < {t.BK}; ++kk) {{
{frag}
            #pragma unroll
            for (int r = 0; r < {t.TM}; ++r) {{
                #pragma unroll
                for (int c = 0; c < {t.TN}; ++c) accv[r][c] = KF_FMA(ra[r], rv[c], accv[r][c]);
            }}
        }}
        }}
        if (more) {{  // the other buffer was last read before the previous barrier
            {loc}float* as = {smem} + (cur ^ 1) * {t.BK * sa};
            {loc}float* bs = {smem} + {2 * t.BK * sa} + (cur ^ 1) * {t.BK * sb};
{_stash(t, kfast, sa, sb)}
        }}
        cur ^= 1;
        KF_BARRIER;
    }}
    #pragma unroll
    for (int r = 0; r < {t.TM}; ++r) {{
        const kf_long i = i0 + rb + (r / 4) * {lr * 4} + (r % 4);
        #pragma unroll
        for (int c = 0; c < {t.TN}; ++c) {{
            const kf_long j = j0 + cb + (c / 4) * {lc * 4} + (c % 4);
            if (i < {M} && j < {N}) {{ float acc = accv[r][c];{store} }}
        }}
    }}"""


def emit(
    L: Lowering,
    out: tuple[int, ...],
    py_shape: str,
    batch_dims: list[str],
    sizes: tuple[str, str, str],
    grid_py: tuple[str, str, str],
    a: Callable[[list[str], str, str], str],
    b: Callable[[list[str], str, str], str],
    coords: Callable[[list[str], str, str], list[str]],
    tag: str,
    node: fx.Node | None,
    bias: Callable[[str], str] | None = None,
    skip_above: bool = False,
) -> Val | None:
    """:meth:`.Lowering.emit_tiled_mm` warp-tiled, or None where no tile of :data:`TILES` fits the traced
    product (too few tiles) or its K bound depends on the block otherwise than through ``TILE_END`` (the
    tile's last row, here ``i0 + BM`` after the swizzle). ``skip_above``: a tile wholly above the diagonal
    returns before its first load."""
    from kfoundry.plugins.llms.offline.lower import TILE_END, horner, unflat

    t = pick(out, len(batch_dims))
    if t is None or "KF_GRP" in sizes[2]:
        return None
    sizes = (sizes[0], sizes[1], sizes[2].replace(TILE_END, f"(i0 + {t.BM})"))
    bc = [f"bc{k}" for k in range(len(batch_dims))]
    decl = "".join(
        f"    const kf_long {c} = {e};\n" for c, e in zip(bc, unflat("bz", batch_dims), strict=True)
    )
    cs = coords(bc, "i", "j")
    dims = L.shape_dims(py_shape, out)
    epi, ctype, _ = L.epilogue(node, out, cs, "float")
    add = f" acc += {bias('j')};" if bias is not None else ""
    store = f"{add} y[{horner(cs, dims)}] = {epi};"
    kfast = tag == "lintile"
    smem = f"kf_wsm{L.nk}"
    ea, eb = a(bc, "i", "ka"), b(bc, "kb", "j")
    floats = {p for p, (_, ctype_) in L.ptrs.items() if ctype_ == "float"}
    if skip_above:  # every (i, j) of the tile has j > i: no one reads it
        decl += f"    if (j0 > i0 + {t.BM - 1}) return;\n"
    text = body(t, L.lang, smem, decl, sizes, ea, eb, kfast, store, floats)
    L.fwd(f"b{L.nk} = torch.empty({py_shape}, dtype=torch.float32, device=dev)")
    gx, gy, gz = grid_py
    launch = f"grid=(_cdiv({gx}, {t.BN}), _cdiv({gy}, {t.BM}), max(1, {gz})), block=({t.nt}, 1, 1)"
    if L.lang == "cuda":
        sbytes = 4 * 2 * t.BK * (t.BM + 4 + t.BN + (4 if kfast else 0))
        launch += f", shared_mem={sbytes}"
    name = L.kernel(text, ctype, "", tag, launch_dims=launch)
    k = L.sched.kernels[-1]
    if L.lang == "cuda":  # one block per SM: the registers of the 16 x 8 accumulators
        k.source = k.source.replace(
            f"KF_KERNEL {k.name}(", f"KF_KERNEL __launch_bounds__({t.nt}, 1) {k.name}(", 1
        )
    L.fwd(k.launch)
    return L.buffer_val(name, out, py_shape, ctype)
