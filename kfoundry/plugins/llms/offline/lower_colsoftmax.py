"""Softmax over a dim that is not the innermost (``torch.softmax(x, dim=1)`` of a (B, R, C) tensor) where the
reduced dim is long: work-groups of 32 columns x ``COL_SLICES`` row slices.

A thread per column (the row schedule's layout for strided reductions) walks all R rows of its column alone,
twice. Here the 32 columns of a work-group lie side by side (each row's 32 reads are one 128-byte run) and
each of the ``COL_SLICES`` threads of a column takes every ``COL_SLICES``-th row: its online (max, sum)
(:func:`.lower_ops._online_step`, four loads in flight), merged through local memory (each slice's sum
rescaled to the column's max), then the write pass over the same rows. Sixteen times the threads per
column and a sixteenth of the rows each: 7.43 ms where the thread per column took 9.11-9.30 on
softmax_dim1_3d's (64, 4096, 4095), against torch.compile's 7.33 (H100, session 17,
``benchmarks/col_softmax_variants.py``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline.elementwise_ops import fn
from kfoundry.plugins.llms.offline.lower import Val, decompose, horner, strided

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering

#: Row slices per column (the work-group is 32 x COL_SLICES threads): 16 on CUDA; 8 on OpenCL, whose
#: devices may cap a work-group at 256 (32 x 8 took 7.58 ms to 32 x 16's 7.43 on the H100).
COL_SLICES = {"cuda": 16, "opencl": 8}

#: The shortest reduced dim taken here: each of 16 slices keeps at least 16 rows (shorter columns, e.g. a
#: softmax over 16-64 channels, keep the thread per column).
MIN_ROWS = 256

#: The fewest columns taken here (fewer: the work-groups would not fill the GPU either way).
MIN_COLUMNS = 32 * 132

#: Loads in flight per thread in both passes.
UNROLL = 4


def applies_shape(shape: tuple[int, ...], d: int) -> bool:
    """Whether the softmax of ``shape`` over ``d`` is one this schedule is for: a strided dim of
    ``MIN_ROWS`` or more, ``MIN_COLUMNS`` columns or more."""
    columns = math.prod(v for k, v in enumerate(shape) if k != d)
    return strided(shape, [d]) and shape[d] >= MIN_ROWS and columns >= MIN_COLUMNS


def applies(L: Lowering, shape: tuple[int, ...], d: int) -> bool:
    """:func:`applies_shape`, in the languages with work-groups (CUDA, OpenCL)."""
    return L.lang in COL_SLICES and applies_shape(shape, d)


def column_softmax(L: Lowering, node: fx.Node, src: Val, d: int, log: bool) -> Val:
    """The (log-)softmax of ``src`` over ``d`` in work-groups of 32 columns x ``COL_SLICES[lang]`` row slices."""
    from kfoundry.plugins.llms.offline.lower_ops import _online_step, unrolled_loop

    n = L.order[node]
    py_shape = f"S{n}"
    L.fwd(f"{py_shape} = {src.py_shape}")
    out = src.shape
    dims = L.shape_dims(py_shape, out)
    keep = [k for k in range(len(out)) if k != d]
    total = " * ".join(f"(kf_long){dims[k]}" for k in keep) or "1"
    coords = [f"c{k}" for k in range(len(out))]
    R = src.dims[d]
    exp, lg = fn("exp", L.lang), fn("log", L.lang)
    at = lambda q: [*coords[:d], q, *coords[d + 1 :]]  # noqa: E731
    x = lambda q: src.load(at(q))  # noqa: E731
    _, final_ctype, _ = L.epilogue(node, out, coords, "float")

    def store(q: str, value: str) -> str:
        cs = at(q)
        e, _, _ = L.epilogue(node, out, cs, "float")
        return f"{{ float acc = {value}; y[{horner(cs, dims)}] = {e}; }}"

    S = COL_SLICES[L.lang]
    value = (lambda v: f"(({v}) - mx - {lg}(den))") if log else (lambda v: f"({exp}(({v}) - mx) * rden)")
    write = unrolled_loop(L, R, x, lambda v, q: store(q, value(v)), "kf_ty", UNROLL, S)
    body = f"""    KF_LOCAL float kf_smx[{S}][33];
    KF_LOCAL float kf_sden[{S}][33];
    const int kf_tx = KF_LID(0), kf_ty = KF_LID(1);
    const kf_long rows = {total};
    const kf_long g = KF_GRP(0) * 32 + kf_tx;
    const int kf_live = g < rows;
    float mx = -INFINITY, den = 0.0f;
    if (kf_live) {{
{decompose("g", [dims[k] for k in keep], [coords[k] for k in keep], "rows")}            {unrolled_loop(L, R, x, lambda v, _: _online_step(v, exp), "kf_ty", UNROLL, S)}
    }}
    kf_smx[kf_ty][kf_tx] = mx;
    kf_sden[kf_ty][kf_tx] = den;
    KF_BARRIER;
    {{  // the slices' (max, sum) pairs: the column's max, each sum rescaled to it (a slice of -inf adds 0)
        float m = -INFINITY, s = 0.0f;
        for (int k = 0; k < {S}; ++k) {{ const float v = kf_smx[k][kf_tx]; m = (v > m || v != v) ? v : m; }}
        for (int k = 0; k < {S}; ++k) {{
            const float v = kf_smx[k][kf_tx];
            s += v == -INFINITY ? 0.0f : (v == m ? kf_sden[k][kf_tx] : kf_sden[k][kf_tx] * {exp}(v - m));
        }}
        mx = m;
        den = s;
    }}
    if (kf_live) {{
{decompose("g", [dims[k] for k in keep], [coords[k] for k in keep], "rows")}        const float rden = 1.0f / den;
        (void)rden;
            {write}
    }}"""
    work = "*".join(f"{py_shape}[{k}]" for k in keep) or "1"
    idx = L.nk
    ydt = "torch.float32"
    L.fwd(f"b{idx} = torch.empty({py_shape}, dtype={ydt}, device=dev)")
    launch = f"grid=(_cdiv({work}, 32), 1, 1), block=(32, {S}, 1)"
    name = L.kernel(body, final_ctype, work, "logsoftmax_cols" if log else "softmax_cols", launch_dims=launch)
    L.fwd(L.sched.kernels[-1].launch)
    return L.buffer_val(name, out, py_shape, final_ctype)
