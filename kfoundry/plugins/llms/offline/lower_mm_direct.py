"""Plain linear layers of the cooperative CUDA graph schedule on ``matmul/sgemm_warp``'s own kernels.

Where a linear layer reads its input and weight straight from buffers (no prologue to fuse: a graph input
or an earlier kernel's output, and a parameter), the product is not written as a graph kernel
(:mod:`.lower_mm_warp`, whose loads go through the lowering's index expressions with 64-bit arithmetic,
per-load bounds and alignment checks: 7-20% behind ``sgemm_warp`` on the same 1024 x 8192 x 8192 products,
H100 and H200, sessions 13-16) but as :mod:`.cookbook_sgemm_warp`'s kernels, appended once to the graph's
source: 32-bit indices, load pointers set before the K loop, rows past M clamped, a 16-byte and a 4-byte
kernel chosen in ``forward``. The bias is added on store; the rest of the layer's elementwise chain is left
to the kernels that read the product (one more pass over M x N, against the K passes of the product).

Where no tile gives the product enough tiles to fill the GPU (a small M x N, a long K: a linear layer after a
flatten) but K's slices would, the layer splits K as ``matmul/sgemm_warp`` does: each slice's partial tile into a workspace, then
``matmul_sum`` adds the slices in order (deterministic) and the bias. Without the split the graph's own
register-blocked kernel ran one thread block per output tile over the whole of K (2.32 ms where cuBLAS took
0.94 on conv1d_maxpool_flatten_linear's 1024 x 1024 x 16384 layer, H100, session 17).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline import lower_mm_warp
from kfoundry.plugins.llms.offline.cookbook_matmul import _epilogue
from kfoundry.plugins.llms.offline.cookbook_sgemm_warp import DEFAULTS, _kernel
from kfoundry.plugins.llms.offline.recognize import OpSpec

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering, Val

#: the fewest output tiles for which the kernels are taken (one per SM of an H200; tests set 0)
MIN_TILES = 132

#: the graph's widest warp tile (:data:`.lower_mm_warp.TILES`), sgemm_warp's default (its 0.90-0.94x of
#: cuBLAS at 4096^3 on the H200): the products the graph would give that tile take these kernels
_WIDEST = lower_mm_warp.TILES[0]
TILE = {
    **{k: getattr(_WIDEST, k) for k in ("BM", "BN", "BK", "WM", "WN", "TM", "TN")},
    "MINB": DEFAULTS["MINB"],
    "SWZ": DEFAULTS["SWZ"],
}

#: kernel names per variant (the bias variant's renamed: both may sit in one source): 16-byte, 4-byte, slice sum
NAMES = {False: ("matmul", "matmul_u", "matmul_sum"), True: ("matmul_b", "matmul_ub", "matmul_sum_b")}

#: split K only where each slice keeps at least this many terms (sgemm_warp's rule)
SPLIT_MIN_K = 512


def _source(bias: bool) -> str:
    """The kernels of one variant, with the tile's defaults (a kernel's own ``-D`` values win)."""
    spec = OpSpec("matmul", [], [], linear=True, bias=bias)
    epi_call = "epilogue({v}, {n}, bias)" if bias else "epilogue({v}, {n})"
    text = _kernel(spec, _epilogue(spec, "cuda"), epi_call)
    if bias:
        text = text.replace(" matmul(", " matmul_b(").replace(" matmul_u(", " matmul_ub(")
        text = text.replace(" matmul_sum(", " matmul_sum_b(")
    head = "".join(f"#ifndef {k}\n#define {k} {v}\n#endif\n" for k, v in TILE.items())
    return f"// matmul/sgemm_warp's kernels (linear layers, bias={int(bias)})\n{head}{text}\n"


def linear(
    L: Lowering, node: fx.Node, x: Val, w: Val, bias: Val | None, out: tuple[int, ...], S: str
) -> Val | None:
    """The product ``x @ w.T (+ bias)`` into a new buffer of shape ``S`` (Python), or None where the kernels
    do not apply: not CUDA's cooperative schedule, an operand that is not a plain float buffer, a product
    the graph gives a narrower tile, or too few output tiles to fill the GPU and too short a K to split."""
    if L.lang != "cuda" or not L.coop:
        return None
    operands = [x, w] + ([bias] if bias is not None else [])
    if any(v.buffer is None or v.ctype != "float" for v in operands) or len(w.shape) != 2:
        return None
    M, N, K = math.prod(out[:-1]), out[-1], x.shape[-1]
    picked = lower_mm_warp.pick((M, N), 0, min_tiles=MIN_TILES)
    tiles = -(-M // TILE["BM"]) * -(-N // TILE["BN"])
    slices = max(1, min(64, 2 * max(MIN_TILES, 1) // tiles, K // SPLIT_MIN_K))
    # the graph's own choice of tile for this product (its padding waste weighed) must be this one, or no
    # tile fills the GPU and K splits into enough slices that the tiles' slices do (a small product, e.g.
    # 128 x 512 x 1024, keeps the graph's smaller tiles over the whole of K)
    split = picked is None and K >= 2 * SPLIT_MIN_K and tiles * slices >= MIN_TILES
    if picked != lower_mm_warp.TILES[0] and not split:
        return None
    has_bias = bias is not None
    if has_bias not in L.direct_mm:
        L.direct_mm.add(has_bias)
        L.sched.tail.append(_source(has_bias))
    vec_name, u_name, sum_name = NAMES[has_bias]
    n = L.order[node]
    idx = L.nk
    L.nk += 1
    xs, ws = str(x.buffer), str(w.buffer)
    bs = f"{bias.buffer}, " if bias is not None else ""
    nt = (TILE["BM"] // TILE["WM"]) * (TILE["BN"] // TILE["WN"]) * 32
    smem = 2 * TILE["BK"] * (TILE["BM"] + 4 + TILE["BN"] + 4) * 4
    L.fwd(f"D{n} = (_prod({S}[:-1]), {S}[-1], {x.py_shape}[-1])")
    L.fwd(
        f"if max(D{n}[0] * D{n}[2], D{n}[1] * D{n}[2], D{n}[0] * D{n}[1]) >= 2 ** 31: "
        f"raise ValueError('kfoundry: the linear layer {node.name} has an operand of 2^31 elements or more "
        "(32-bit indices)')"
    )
    L.fwd(f"b{idx} = torch.empty({S}, dtype=torch.float32, device=dev)")
    bm, bn, bk = TILE["BM"], TILE["BN"], TILE["BK"]
    # K's slices (sgemm_warp's rule): a slice per missing tile up to two per SM, each SPLIT_MIN_K terms or more
    L.fwd(f"T{n} = _cdiv(D{n}[0], {bm}) * _cdiv(D{n}[1], {bn})")
    L.fwd(
        f"Z{n} = max(1, min(64, {2 * max(MIN_TILES, 1)} // T{n}, D{n}[2] // {SPLIT_MIN_K})) "
        f"if T{n} < {MIN_TILES} else 1"
    )
    L.fwd(f"C{n} = _cdiv(_cdiv(D{n}[2], Z{n}), {bk}) * {bk}")
    L.fwd(f"Z{n} = _cdiv(D{n}[2], C{n})")
    L.fwd(
        f"W{n} = torch.empty((Z{n}, D{n}[0], D{n}[1]), dtype=torch.float32, device=dev) if Z{n} > 1 else b{idx}"
    )
    L.fwd(
        f"(self.prog.{vec_name} if D{n}[2] % 4 == 0 and _aligned({xs}, {ws}) else self.prog.{u_name})"
        f"({xs}, {ws}, {bs}W{n}, D{n}[0], D{n}[1], D{n}[2], C{n}, "
        f"grid=(_cdiv(D{n}[1], {bn}), _cdiv(D{n}[0], {bm}), Z{n}), block=({nt}, 1, 1), "
        f"shared_mem={smem})"
    )
    L.fwd(
        f"if Z{n} > 1: self.prog.{sum_name}(W{n}, {bs}b{idx}, D{n}[0], D{n}[1], Z{n}, "
        "grid=(_cdiv(D{n}[0] * D{n}[1], 256), 1, 1), block=(256, 1, 1))".replace("{n}", str(n))
    )
    return L.buffer_val(f"b{idx}", out, S)
