"""Scaled dot-product attention through the matrix-product machinery of :class:`.lower.Lowering`.

``softmax(Q K^T * scale [causal: -inf where j > i]) V`` as three kernels over a materialised score
buffer (batch x L x S floats): the scores as a batched tiled product (K read along its rows, the
layout of a linear layer's weight, so the register-blocked schedule loads it k-fast), the softmax a row
kernel that applies the scale as it reads and, causal, skips the keys past the diagonal (a row with no
finite score gives 0, as torch does), then the probabilities times V as a second batched product whose
epilogue takes the attention node's elementwise chain; causal, a tile of query rows stops its keys at
its last row's diagonal (half the work), and a last pass redoes any non-finite output over its row's own
keys (a NaN value past the diagonal, times probability 0 inside the diagonal tile, must not reach it) and
applies the node's epilogue chain. The one-pass lowering (a work item per query row) stays in
:func:`.lower_ops._sdpa` for the unfused schedule and degenerate shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline.elementwise_ops import fn
from kfoundry.plugins.llms.offline.lower import TILE_END, Val, _shape
from kfoundry.plugins.llms.offline.lower_ops import _bc_coords, chunked_sum, extreme_loop, row_loop

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering


def sdpa_by_matmuls(L: Lowering, node: fx.Node, q: Val, k: Val, v: Val, causal: bool, scale: str) -> Val:
    """The attention ``node`` (operands ``q``, ``k``, ``v``; ``scale`` a C expression) as scores product,
    softmax rows and probabilities-times-V product; the output's shape ``S{n}`` is set by the caller."""
    n = L.order[node]
    out = _shape(node)
    batch = out[:-2]
    nb = len(batch)
    Lq, Skv, E, Dv = q.dims[-2], k.dims[-2], q.dims[-1], v.dims[-1]
    at_q = lambda bc: _bc_coords(bc, batch, q.shape[:-2])  # noqa: E731
    at_k = lambda bc: _bc_coords(bc, batch, k.shape[:-2])  # noqa: E731
    at_v = lambda bc: _bc_coords(bc, batch, v.shape[:-2])  # noqa: E731

    # scores[b, i, j] = sum_e q[b, i, e] * k[b, j, e] (unscaled: the softmax scales as it reads)
    P = f"S{n}_qk"
    L.fwd(f"{P} = S{n}[:-1] + ({k.py_shape}[-2],)")
    sshape = (*batch, q.shape[-2], k.shape[-2])
    scores = L.emit_tiled_mm(
        sshape,
        P,
        L.shape_dims(P, sshape)[:nb],
        (Lq, Skv, E),
        (f"{P}[-1]", f"{P}[-2]", f"_prod({P}[:-2])"),
        lambda bc, i, e: q.load([*at_q(bc), i, e]),
        lambda bc, e, j: k.load([*at_k(bc), j, e]),
        lambda bc, i, j: [*bc, i, j],
        "lintile",  # B[j, k] layout: the register-blocked schedule loads K along its rows
        None,
        skip_above=causal,  # the softmax reads no score past the diagonal
    )

    f = lambda name: fn(name, L.lang)  # noqa: E731

    def softmax(c: list[str], store: Callable[[list[str], str], str]) -> str:
        # causal: the keys past the diagonal skipped (probability 0 whatever their score), as the
        # one-pass lowering and torch's blocked kernels; a row with no finite score gives 0
        i = c[-2]
        x = lambda j: f"(({scores.load([*c[:-1], j])}) * {scale})"  # noqa: E731
        end = f"(({i}) + 1 < {Skv} ? ({i}) + 1 : {Skv})" if causal else Skv
        ln = L.lanes(k.shape[-2])
        s = extreme_loop(L, "mx", end, x, ">", ln) + "\n        "
        s += chunked_sum(L, "den", end, lambda j: f"{f('exp')}({x(j)} - mx)", lanes=ln)
        w = L.fresh("r")
        keep = f"{w} < {end} && mx != -INFINITY" if causal else "mx != -INFINITY"
        val = f"(({keep}) ? {f('exp')}({x(w)} - mx) / den : 0.0f)"
        return s + f"\n        {row_loop(w, Skv, ln)} {store([*c[:-1], w], val)}"

    probs = L.emit_rows(sshape, P, [nb + 1], softmax, "sdpa_softmax", node=None)

    # out[b, i, d] = sum_j probs[b, i, j] * v[b, j, d]; the node's epilogue chain applied on store (causal:
    # by the exact pass after it)
    S = f"S{n}"
    kv = Skv
    if causal:  # a tile of query rows stops at its last row's diagonal (the probabilities past it are 0)
        kv = causal_bound(Skv)
    pv = L.emit_tiled_mm(
        out,
        S,
        L.shape_dims(S, out)[:nb],
        (Lq, Dv, kv),
        (f"{S}[-1]", f"{S}[-2]", f"_prod({S}[:-2])"),
        lambda bc, i, j: probs.load([*bc, i, j]),
        lambda bc, j, d: v.load([*at_v(bc), j, d]),
        lambda bc, i, d: [*bc, i, d],
        "sdpa_pv",
        None if causal else node,
    )
    if not causal:
        return pv

    # Non-finite values of V past the diagonal: torch's CPU kernel multiplies every key's probability up to
    # the end of its query block, 0 past the diagonal, by V, so a NaN or infinity in a column of V makes that
    # column NaN in every row of the block (measured: every row up to 300 keys; at 1024 keys the rows from
    # 512 on); its CUDA kernels skip the keys past the diagonal. Off CUDA (``_kf_allkeys``) a kernel marks
    # V's columns holding one and the exact pass redoes those outputs over every key: torch's CPU result
    # while the keys fit one of its query blocks (PoCL's small shapes), its blocking past that.
    L.fwd("_kf_allkeys = int(dev.type != 'cuda')")
    allkeys = L.sym("_kf_allkeys")
    L.fwd(f"S{n}_vb = S{n}[:-2] + (S{n}[-1],)")

    def bad_columns(c: list[str]) -> str:
        j = L.fresh("j")
        val = L.fresh("t")
        return (
            f"float acc = 0.0f;\n        for (kf_long {j} = 0; {j} < {Skv}; ++{j}) {{ "
            f"const float {val} = {v.load([*at_v(c[:-1]), j, c[-1]])}; if ({val} - {val} != 0.0f) acc = 1.0f; }}"
        )

    vbad = L.emit_pointwise((*batch, out[-1]), f"S{n}_vb", bad_columns, "sdpa_vbad")
    launch = L.sched.forward[-1]
    assert "_sdpa_vbad(" in launch
    L.sched.forward[-1] = f"if _kf_allkeys: {launch}"  # on CUDA the flags are never read

    def exact(c: list[str]) -> str:
        # a non-finite output: redone over the row's own keys only (torch's CUDA kernels), or over every
        # key where V's column holds a non-finite value off CUDA (torch's math path)
        j = L.fresh("j")
        end = f"(({c[-2]}) + 1 < {Skv} ? ({c[-2]}) + 1 : {Skv})"
        term = f"({probs.load([*c[:-1], j])}) * ({v.load([*at_v(c[:-2]), j, c[-1]])})"
        return (
            f"float acc = {pv.load(c)};\n"
            f"        if ({allkeys} && {vbad.load([*c[:-2], c[-1]])} != 0.0f) {{ acc = 0.0f; "
            f"for (kf_long {j} = 0; {j} < {Skv}; ++{j}) acc += {term}; }}\n"
            f"        else if (acc - acc != 0.0f) {{ acc = 0.0f; "
            f"for (kf_long {j} = 0; {j} < {end}; ++{j}) acc += {term}; }}"
        )

    return L.emit_pointwise(out, S, exact, "sdpa_exact", node=node)


def causal_bound(keys: str) -> str:
    """The K bound of a causal P @ V tile: its last query row's diagonal, at most ``keys``."""
    return f"({TILE_END} < {keys} ? {TILE_END} : (kf_long){keys})"
