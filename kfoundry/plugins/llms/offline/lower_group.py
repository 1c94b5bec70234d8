"""Sibling reductions read once (horizontal fusion, Inductor's idea).

Long reductions with few outputs (:func:`.lower_split.grid_reduce`'s) are not emitted when lowered: each
is held as *pending*, its value a buffer name (an alias) that no kernel has written yet. A later
reduction over the same iteration space (a source of the same traced shape, reduced over the same dims;
``keepdim`` may differ) whose terms do not read a pending value joins the group; the group is emitted
as ONE first-stage kernel (:func:`.lower_split.grid_reduce_group`: every input read once for all of its
folds, e.g. a row's max and min, or three losses over the same logits and labels) when anything else is
about to be emitted: a kernel, a ``forward`` line that names a pending value, or the output. A group of
one is emitted as before (the contiguous-run kernel of :func:`.lower_stats.block_reduce` where it
applies), without its epilogue chain: the chain's nodes stay elementwise consumers of the value.

Sources of the same traced shape may differ at run time; ``forward`` then raises (the group's kernel
would read past one of them) instead of computing a wrong value.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kfoundry.plugins.llms.offline import lower_split, lower_stats

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering, Val

#: at most this many folds in one group (each holds four accumulators a thread)
MAX_FOLDS = 4

#: the kernels of the n-th flush are numbered from n * FLUSH_BASE (a schedule has far fewer kernels)
FLUSH_BASE = 1000


@dataclass(frozen=True)
class Pending:
    """A deferred reduction: its fold, the iteration space it shares with its group, and its alias."""

    fold: lower_split.Fold
    dims: tuple[int, ...]
    keep: bool
    out: tuple[int, ...]
    rdims: list[str]
    count_py: str
    row_py: str
    in_coords: Callable[[list[str], list[str]], list[str]]
    alias: str

    def joins(self, other: Pending) -> bool:
        """Whether ``self`` may share a first-stage kernel with ``other`` (the group's first)."""
        return (self.fold.src.shape, self.dims) == (other.fold.src.shape, other.dims)


def defer(
    L: Lowering,
    fold: lower_split.Fold,
    dims: list[int],
    keep: bool,
    out: tuple[int, ...],
    rdims: list[str],
    count_py: str,
    row_py: str,
    in_coords: Callable[[list[str], list[str]], list[str]],
) -> Val:
    """Hold ``fold`` (a :func:`.lower_split.grid_reduce` reduction) pending and return its value: a buffer
    that the group's kernels write when :func:`flush` emits them."""
    item = Pending(fold, tuple(dims), keep, out, rdims, count_py, row_py, in_coords, f"bq{fold.tag}")
    group = L.pending
    if group and not (len(group) < MAX_FOLDS and item.joins(group[0]) and not _reads_pending(L, item)):
        flush(L)
    L.pending.append(item)
    return L.buffer_val(item.alias, out, f"S{fold.tag}")


def _reads_pending(L: Lowering, item: Pending) -> bool:
    """Whether ``item``'s terms read a pending value (they would run before it is written)."""
    names = [p for p, (py, _) in L.ptrs.items() if any(py == q.alias for q in L.pending)]
    if not names:
        return False
    ocs = [f"o{k}" for k in range(len(item.out))]
    rcs = [f"rc{k}" for k in range(len(item.rdims))]
    L.let_stack.append(None)  # inline: the trial binds nothing
    try:
        text = item.fold.src.load(item.in_coords(ocs, rcs))
    finally:
        L.let_stack.pop()
    return any(re.search(rf"\b{n}\b", text) for n in names)


def flush(L: Lowering) -> None:
    """Emit the pending group's kernels and bind each alias to its fold's output buffer."""
    group, L.pending = L.pending, []
    if not group:
        return
    # the flush may run inside another kernel's emission, after it named its output ``b{L.nk}``: the
    # group's kernels and buffers take numbers of their own (a block per flush) and leave L.nk as it was
    saved, L.flushes = L.nk, L.flushes + 1
    L.nk = FLUSH_BASE * L.flushes
    try:
        _emit(L, group)
    finally:
        L.nk = saved


def _emit(L: Lowering, group: list[Pending]) -> None:
    head = group[0]
    for q in group[1:]:
        if q.fold.src.py_shape != head.fold.src.py_shape:
            L.fwd(
                f"if tuple({q.fold.src.py_shape}) != tuple({head.fold.src.py_shape}): raise ValueError("
                f"'kfoundry: sibling reductions traced over one shape got ' + "
                f"repr(({q.fold.src.py_shape}, {head.fold.src.py_shape})))"
            )
    rshape = tuple(head.fold.src.shape[k] for k in head.dims)
    vals: list[Val] | None = None
    if len(group) == 1 and L.fuse:
        f = head.fold
        one = lower_stats.block_reduce(
            L, None, f.src, f.op, f.p, f.tag, head.out, list(head.dims), f.divide_by
        )
        vals = [one] if one is not None else None
    if vals is None:
        vals = lower_split.grid_reduce_group(
            L,
            [q.fold for q in group],
            head.out,
            head.rdims,
            rshape,
            head.count_py,
            head.row_py,
            head.in_coords,
        )
    for q, v in zip(group, vals, strict=True):
        L.fwd(f"{q.alias} = {v.buffer}")
