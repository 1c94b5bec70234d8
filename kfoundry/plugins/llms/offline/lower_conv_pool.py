"""A convolution whose only consumer is a mean or sum over all its spatial dims (``x.mean((2, 3))``,
``adaptive_avg_pool2d(x, 1)``, after the conv's elementwise epilogue): reduced in the implicit-GEMM
kernel's epilogue instead of written out.

Each output tile of the conv (16CM channels x 16CN positions of one image) sums its positions per
channel, in registers and then across the tile's 16 column threads through local memory in a fixed
order, and writes one partial per (image, channel, tile): no atomics, so the result is deterministic.
A second, small reduction (the generic one of :func:`.lower_ops.reduce`, with the reduction node's own
epilogue) folds the ``T`` partials of each (image, channel) and divides by the positions for a mean.
The conv output (``N x C x P`` floats) is never stored nor read back: its write and the reduction's
read, the whole memory traffic of the chain, shrink to ``N x C x T`` partials (``T = P / 16CN``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch.fx as fx

from kfoundry.plugins.llms.offline.lower import Val, _shape

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering

#: Smallest number of positions per (image, channel) plane worth the epilogue reduction: below it the
#: conv output is small and the ordinary store then reduction is kept.
MIN_POSITIONS = 1024

#: Output columns per tile assumed for the traced partials' count (the runtime count is exact).
TILE_COLS = 64


def spatial_reduction(L: Lowering, tail: fx.Node, nd: int) -> tuple[fx.Node, bool, bool] | None:
    """(the reduction node, keepdim, whether it is a mean) where ``tail`` (a conv, or the last node of
    its epilogue chain) has a single user that is a float sum / mean over exactly dims ``2..`` (or a
    one-cell adaptive average pool); else None."""
    from kfoundry.plugins.llms.offline import lower_ops as ops
    from kfoundry.plugins.llms.offline import lower_pool

    users = L.users.get(tail, [])
    if len(users) != 1 or not L.fuse:
        return None
    red = users[0]
    if red.op not in ("call_function", "call_method", "call_module") or ops._args(red)[:1] != [tail]:
        return None
    name, mod = ops._target_name(L, red)
    spatial = list(range(2, 2 + nd))
    if mod is not None:
        if type(mod).__name__ == f"AdaptiveAvgPool{nd}d" and lower_pool.is_global(mod.output_size, nd):
            return red, True, True
        return None
    key = name.split(".")[-1]
    if name.startswith(("F.", "torch.")) and key == f"adaptive_avg_pool{nd}d":
        size = ops._arg(red, 1, "output_size")
        return (red, True, True) if lower_pool.is_global(size, nd) else None
    if (
        key not in ("sum", "mean")
        or not name.startswith(("method.", "torch."))
        or "dtype" in ops._kwargs(red)
    ):
        return None
    d: Any = ops._arg(red, 1, "dim")
    if d is None or isinstance(d, fx.Node) or ops._dims_list(d, 2 + nd) != spatial:
        return None
    return red, bool(ops._arg(red, 2, "keepdim", False)), key == "mean"


def fold_text(
    cm_rows: str, images: str, cout: str, cout_g: str, tile: str, tiles: str, lanes: bool
) -> tuple[str, str, str]:
    """C for the conv epilogue: (declarations before the row loop, a row's fold of its ``v[c]`` after
    the epilogue, the tile's combination and partial store after the row loop). ``tile`` is this
    work-group's tile index along the positions, ``tiles`` their count. Where the fold runs a warp per
    (image, channel) (``lanes``) its ``tiles`` partials are contiguous; else partial ``tile`` of every
    (image, channel) is one contiguous row (the fold's work items read adjacent partials)."""
    plane = f"((kf_long)nb * {cout} + g * {cout_g} + m)"
    at = f"{plane} * {tiles} + ({tile})" if lanes else f"(kf_long)({tile}) * ({images} * {cout}) + {plane}"
    head = f"""    float psum[{cm_rows}];
    #pragma unroll
    for (int r = 0; r < {cm_rows}; ++r) psum[r] = 0.0f;
"""
    row = """        {
            float s = 0.0f;
            #pragma unroll
            for (int c = 0; c < CN; ++c) if (ok[c]) s += v[c];
            psum[r] = s;
        }
"""
    tail = f"""
    // the tile's 16 column threads hold partial sums of the same rows: combined in a fixed order
    #pragma unroll
    for (int r = 0; r < {cm_rows}; ++r) As[0][tx][ty * {cm_rows} + r] = psum[r];
    KF_BARRIER;
    for (int q = tid; q < 16 * {cm_rows}; q += 256) {{
        const int m = i0 + q;
        if (m < {cout_g}) {{
            float s = 0.0f;
            #pragma unroll
            for (int x = 0; x < 16; ++x) s += As[0][x][q];
            y[{at}] = s;
        }}
    }}"""
    return head, row, tail


def partials_layout(L: Lowering, tiles: int) -> bool:
    """Whether the fold of ``tiles`` partials per output runs a warp per output: the partials are then
    laid out (image, channel, tile), else (tile, image, channel)."""
    return L.lanes(tiles)


def partials_val(
    L: Lowering, red: fx.Node, keep: bool, nd: int, buffer: str, conv_py: str, tiles_py: str, lanes: bool
) -> tuple[Val, int]:
    """The partials buffer as a tensor ``(N, C, T)`` (``lanes``) or ``(T, N, C)``, then ``1``s for the
    pooled dims where the reduction keeps them; returns it and the dim whose fold is the result."""
    n = L.order[red]
    ones = (1,) * nd if keep else ()
    conv = _shape(red.args[0]) if isinstance(red.args[0], fx.Node) else ()
    tiles = -(-math.prod(conv[2:]) // TILE_COLS)  # traced estimate (heuristics only)
    if lanes:
        L.fwd(f"SQ{n} = ({conv_py}[0], {conv_py}[1], {tiles_py}) + {ones!r}")
        return L.buffer_val(buffer, (*conv[:2], tiles, *ones), f"SQ{n}"), 2
    L.fwd(f"SQ{n} = ({tiles_py}, {conv_py}[0], {conv_py}[1]) + {ones!r}")
    return L.buffer_val(buffer, (tiles, *conv[:2], *ones), f"SQ{n}"), 0


def finish(L: Lowering, red: fx.Node, parts: Val, dim: int, mean: bool, positions: str) -> None:
    """Lower ``red`` now as the fold of the partials (divided by ``positions`` for a mean), with its own
    epilogue, and settle it (the walk then skips it)."""
    from kfoundry.plugins.llms.offline import lower_ops as ops

    val = ops.reduce(L, red, parts, "sum", [dim], False, divide_by=positions if mean else "")
    L.settle(red, val)
