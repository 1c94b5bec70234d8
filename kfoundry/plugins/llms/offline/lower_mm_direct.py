"""Plain linear layers of the cooperative CUDA graph schedule on ``matmul/sgemm_warp``'s own kernels.

Where a linear layer reads its input and weight straight from buffers (no prologue to fuse: a graph input
or an earlier kernel's output, and a parameter), the product is not written as a graph kernel
(:mod:`.lower_mm_warp`, whose loads go through the lowering's index expressions with 64-bit arithmetic,
per-load bounds and alignment checks: 7-20% behind ``sgemm_warp`` on the same 1024 x 8192 x 8192 products,
H100 and H200, sessions 13-16) but as :mod:`.cookbook_sgemm_warp`'s kernels, appended once to the graph's
source: 32-bit indices, load pointers set before the K loop, rows past M clamped, a 16-byte and a 4-byte
kernel chosen in ``forward``. The bias is added on store; the rest of the layer's elementwise chain is left
to the kernels that read the product (one more pass over M x N, against the K passes of the product).
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

#: kernel names per variant (the bias variant's renamed: both may sit in one source)
NAMES = {False: ("matmul", "matmul_u"), True: ("matmul_b", "matmul_ub")}


def _source(bias: bool) -> str:
    """The kernels of one variant, with the tile's defaults (a kernel's own ``-D`` values win)."""
    spec = OpSpec("matmul", [], [], linear=True, bias=bias)
    epi_call = "epilogue({v}, {n}, bias)" if bias else "epilogue({v}, {n})"
    text = _kernel(spec, _epilogue(spec, "cuda"), epi_call)
    # split K is never taken here (enough tiles): its summing kernel is renamed out of the way
    text = text.replace(" matmul_sum(", f" kf_unused_sum{'_b' if bias else ''}(")
    if bias:
        text = text.replace(" matmul(", " matmul_b(").replace(" matmul_u(", " matmul_ub(")
    head = "".join(f"#ifndef {k}\n#define {k} {v}\n#endif\n" for k, v in TILE.items())
    return f"// matmul/sgemm_warp's kernels (linear layers, bias={int(bias)})\n{head}{text}\n"


def linear(
    L: Lowering, node: fx.Node, x: Val, w: Val, bias: Val | None, out: tuple[int, ...], S: str
) -> Val | None:
    """The product ``x @ w.T (+ bias)`` into a new buffer of shape ``S`` (Python), or None where the kernels
    do not apply: not CUDA's cooperative schedule, an operand that is not a plain float buffer, or too few
    output tiles to fill the GPU."""
    if L.lang != "cuda" or not L.coop:
        return None
    operands = [x, w] + ([bias] if bias is not None else [])
    if any(v.buffer is None or v.ctype != "float" for v in operands) or len(w.shape) != 2:
        return None
    M, N = math.prod(out[:-1]), out[-1]
    if -(-M // TILE["BM"]) * -(-N // TILE["BN"]) < MIN_TILES:
        return None
    # the graph's own choice of tile for this product (its padding waste weighed) must be this one
    if lower_mm_warp.pick((M, N), 0, min_tiles=MIN_TILES) != lower_mm_warp.TILES[0]:
        return None
    has_bias = bias is not None
    if has_bias not in L.direct_mm:
        L.direct_mm.add(has_bias)
        L.sched.tail.append(_source(has_bias))
    vec_name, u_name = NAMES[has_bias]
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
    L.fwd(
        f"(self.prog.{vec_name} if D{n}[2] % 4 == 0 and _aligned({xs}, {ws}) else self.prog.{u_name})"
        f"({xs}, {ws}, {bs}b{idx}, D{n}[0], D{n}[1], D{n}[2], D{n}[2], "
        f"grid=(_cdiv(D{n}[1], {TILE['BN']}), _cdiv(D{n}[0], {TILE['BM']}), 1), block=({nt}, 1, 1), "
        f"shared_mem={smem})"
    )
    return L.buffer_val(f"b{idx}", out, S)
