"""Ops written as compositions of ones the lowering has (:mod:`.normalize_forms` applies them):
``F.rms_norm``, ``torch.outer``, ``F.pairwise_distance``, ``torch.linalg.vector_norm`` /
``torch.linalg.norm`` of a vector, ``torch.lerp``, ``torch.addcmul``, ``torch.logit``,
``torch.nan_to_num``, a power of a number (``2.0 ** x``), ``F.glu``, ``torch.diff``,
``F.binary_cross_entropy(_with_logits)`` and ``F.soft_margin_loss``. Sizes stay traced
(``x.size(dim)`` nodes), so one build still serves every shape."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

__all__ = ["COMPOSITIONS"]

Make = Callable[[fx.Graph, fx.Node], fx.Node | None]


def _c(g: fx.Graph, fn: Any, *args: Any, **kwargs: Any) -> fx.Node:
    return g.call_function(fn, args, kwargs)


def _arg(node: fx.Node, pos: int, key: str, default: Any = None) -> Any:
    if key in node.kwargs:
        return node.kwargs[key]
    return node.args[pos] if len(node.args) > pos else default


def _reducible(n: fx.Node) -> bool:
    return n.kwargs.get("reduction", "mean") in ("mean", "sum", "none") and len(n.args) <= 2


def _reduce(g: fx.Graph, loss: fx.Node, reduction: Any) -> fx.Node | None:
    if reduction == "mean":
        return _c(g, torch.mean, loss)
    if reduction == "sum":
        return _c(g, torch.sum, loss)
    return loss if reduction == "none" else None


def _rms_norm(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    x, shape = n.args[0], _arg(n, 1, "normalized_shape")
    weight, eps = _arg(n, 2, "weight"), _arg(n, 3, "eps")
    k = len(shape) if isinstance(shape, list | tuple) else 1
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    dims = list(range(-k, 0))
    ms = _c(g, torch.mean, _c(g, operator.mul, x, x), dims, keepdim=True)
    y = _c(g, operator.mul, x, _c(g, torch.rsqrt, _c(g, operator.add, ms, eps)))
    return y if weight is None else _c(g, operator.mul, y, weight)


def _outer(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    a, b = n.args[0], n.args[1]
    return _c(g, operator.mul, _c(g, torch.unsqueeze, a, 1), _c(g, torch.unsqueeze, b, 0))


def _pairwise_distance(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    a, b = n.args[0], n.args[1]
    p, eps, keep = (
        float(_arg(n, 2, "p", 2.0)),
        float(_arg(n, 3, "eps", 1e-6)),
        bool(_arg(n, 4, "keepdim", False)),
    )
    d = _c(g, operator.add, _c(g, operator.sub, a, b), eps)
    return _c(g, torch.norm, d, p=p, dim=-1, keepdim=keep)


def _vector_norm(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    ord_ = _arg(n, 1, "ord", 2)
    dim, keep = _arg(n, 2, "dim"), bool(_arg(n, 3, "keepdim", False))
    if dim is None or not isinstance(ord_, int | float) or "dtype" in n.kwargs:
        return None
    return _c(g, torch.norm, n.args[0], p=float(ord_), dim=dim, keepdim=keep)


def _linalg_norm(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    dim = _arg(n, 2, "dim")
    if not isinstance(dim, int) and not (isinstance(dim, list | tuple) and len(dim) == 1):
        return None  # a matrix norm
    return _vector_norm(g, n)


def _lerp(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    a, b, w = n.args[0], n.args[1], _arg(n, 2, "weight")
    return _c(g, operator.add, a, _c(g, operator.mul, w, _c(g, operator.sub, b, a)))


def _addcmul(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    x, t1, t2, v = n.args[0], n.args[1], n.args[2], float(_arg(n, 3, "value", 1.0))
    return _c(g, operator.add, x, _c(g, operator.mul, _c(g, operator.mul, t1, t2), v))


def _logit(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    x, eps = n.args[0], _arg(n, 1, "eps")
    z = x if eps is None else _c(g, torch.clamp, x, float(eps), 1.0 - float(eps))
    return _c(g, torch.log, _c(g, operator.truediv, z, _c(g, operator.sub, 1.0, z)))


def _nan_to_num(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    x = n.args[0]
    big = float(torch.finfo(torch.float32).max)
    nan, pos, neg = (_arg(n, i, k) for i, k in ((1, "nan"), (2, "posinf"), (3, "neginf")))
    y = _c(g, torch.where, _c(g, operator.eq, x, -math.inf), -big if neg is None else float(neg), x)
    y = _c(g, torch.where, _c(g, operator.eq, x, math.inf), big if pos is None else float(pos), y)
    return _c(g, torch.where, _c(g, operator.ne, x, x), 0.0 if nan is None else float(nan), y)


def _pow_of_number(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    base, e = n.args[0], n.args[1]
    if not isinstance(base, int | float) or isinstance(base, bool) or base <= 0 or not isinstance(e, fx.Node):
        return None
    return _c(g, torch.exp2, _c(g, operator.mul, e, math.log2(base)))


def _halves(g: fx.Graph, x: fx.Node, dim: int, k: int) -> fx.Node:
    """``x.narrow(dim, k * half, half)`` with ``half = x.size(dim) // 2``."""
    half = _c(g, operator.floordiv, g.call_method("size", (x, dim)), 2)
    start = 0 if k == 0 else half
    return g.call_method("narrow", (x, dim, start, half))


def _glu(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    x, dim = _arg(n, 0, "input"), int(_arg(n, 1, "dim", -1))
    if not isinstance(x, fx.Node):
        return None
    return _c(g, operator.mul, _halves(g, x, dim, 0), _c(g, torch.sigmoid, _halves(g, x, dim, 1)))


def _diff(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    x, times, dim = n.args[0], int(_arg(n, 1, "n", 1)), int(_arg(n, 2, "dim", -1))
    if times != 1 or _arg(n, 3, "prepend") is not None or _arg(n, 4, "append") is not None:
        return None
    m = _c(g, operator.sub, g.call_method("size", (x, dim)), 1)
    return _c(
        g, operator.sub, g.call_method("narrow", (x, dim, 1, m)), g.call_method("narrow", (x, dim, 0, m))
    )


def _bce_logits(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    x, y = n.args[0], _arg(n, 1, "target")
    if _arg(n, 2, "weight") is not None or n.kwargs.get("pos_weight") is not None or not _reducible(n):
        return None
    # max(x, 0) - x y + log1p(exp(-|x|))
    soft = _c(g, torch.log1p, _c(g, torch.exp, _c(g, torch.neg, _c(g, torch.abs, x))))
    loss = _c(
        g, operator.add, _c(g, operator.sub, _c(g, torch.clamp, x, min=0.0), _c(g, operator.mul, x, y)), soft
    )
    return _reduce(g, loss, n.kwargs.get("reduction", "mean"))


def _bce(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    p, y = n.args[0], _arg(n, 1, "target")
    if _arg(n, 2, "weight") is not None or not _reducible(n):
        return None
    lp = _c(g, torch.clamp, _c(g, torch.log, p), min=-100.0)
    lq = _c(g, torch.clamp, _c(g, torch.log, _c(g, operator.sub, 1.0, p)), min=-100.0)
    both = _c(
        g, operator.add, _c(g, operator.mul, y, lp), _c(g, operator.mul, _c(g, operator.sub, 1.0, y), lq)
    )
    return _reduce(g, _c(g, torch.neg, both), n.kwargs.get("reduction", "mean"))


def _soft_margin(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    x, y = n.args[0], _arg(n, 1, "target")
    if not _reducible(n):
        return None
    loss = _c(g, torch.log1p, _c(g, torch.exp, _c(g, torch.neg, _c(g, operator.mul, y, x))))
    return _reduce(g, loss, n.kwargs.get("reduction", "mean"))


def _softplus(g: fx.Graph, n: fx.Node) -> fx.Node | None:
    """``F.softplus(x, beta, threshold)`` other than the defaults: log1p(exp(beta x)) / beta, x past the
    threshold (the default spelling is the cookbook's own expression)."""
    x, beta, th = n.args[0], float(_arg(n, 1, "beta", 1.0)), float(_arg(n, 2, "threshold", 20.0))
    if beta == 1.0 and th == 20.0:
        return None
    bx = _c(g, operator.mul, x, beta)
    soft = _c(g, operator.truediv, _c(g, torch.log1p, _c(g, torch.exp, bx)), beta)
    return _c(g, torch.where, _c(g, operator.gt, bx, th), x, soft)


COMPOSITIONS: dict[Any, Make] = {
    F.softplus: _softplus,
    F.rms_norm: _rms_norm,
    torch.outer: _outer,
    torch.ger: _outer,
    F.pairwise_distance: _pairwise_distance,
    torch.linalg.vector_norm: _vector_norm,
    torch.linalg.norm: _linalg_norm,
    torch.lerp: _lerp,
    torch.addcmul: _addcmul,
    torch.logit: _logit,
    torch.nan_to_num: _nan_to_num,
    torch.pow: _pow_of_number,
    operator.pow: _pow_of_number,
    F.glu: _glu,
    torch.diff: _diff,
    F.binary_cross_entropy_with_logits: _bce_logits,
    F.binary_cross_entropy: _bce,
    F.soft_margin_loss: _soft_margin,
}


# -- sums of full reductions ---------------------------------------------------------------------

_FULL = {torch.sum: "sum", torch.mean: "mean", "sum": "sum", "mean": "mean"}


def _meta_shape(n: Any) -> tuple[int, ...] | None:
    meta = n.meta.get("tensor_meta") if isinstance(n, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def _is_number(a: Any) -> bool:
    """A factor of a linear form: a Python number or a traced Python value (a size), not a tensor."""
    if isinstance(a, fx.Node):
        return _meta_shape(a) is None and a.op != "placeholder" and not a.meta.get("tensor_meta")
    return isinstance(a, int | float) and not isinstance(a, bool)


def _linear(n: fx.Node, inner: list[fx.Node]) -> list[tuple[fx.Node, str, list[tuple[Any, Any]]]] | None:
    """``n`` as a sum of full reductions ``[(input, sum|mean, [(op, factor)...])]`` (products and quotients
    by numbers, negation, sums and differences); the tree's nodes other than the reductions' inputs go to
    ``inner``. None where ``n`` is anything else."""
    target = n.target if n.op == "call_function" else n.target if n.op == "call_method" else None
    kind = _FULL.get(target) if isinstance(target, str) or callable(target) else None
    if kind and len(n.args) == 1 and not n.kwargs and isinstance(n.args[0], fx.Node):
        inner.append(n)
        return [(n.args[0], kind, [])]
    if n.op != "call_function":
        return None
    a = n.args
    if n.target in (operator.add, operator.sub, torch.add, torch.sub) and len(a) == 2 and not n.kwargs:
        l_node, r_node = a
        if not (isinstance(l_node, fx.Node) and isinstance(r_node, fx.Node)):
            return None
        if _meta_shape(l_node) != () or _meta_shape(r_node) != ():
            return None
        left, right = _linear(l_node, inner), _linear(r_node, inner)
        if left is None or right is None:
            return None
        if n.target in (operator.sub, torch.sub):
            right = [(x, k, [*f, (operator.neg, None)]) for x, k, f in right]
        inner.append(n)
        return left + right
    if n.target in (operator.mul, torch.mul, operator.truediv, torch.div) and len(a) == 2 and not n.kwargs:
        div = n.target in (operator.truediv, torch.div)
        for t, k in ((a[0], a[1]), (a[1], a[0])) if not div else ((a[0], a[1]),):
            if isinstance(t, fx.Node) and _meta_shape(t) == () and _is_number(k):
                terms = _linear(t, inner)
                if terms is None:
                    return None
                op = operator.truediv if div else operator.mul
                inner.append(n)
                return [(x, kd, [*f, (op, k)]) for x, kd, f in terms]
        return None
    if n.target in (operator.neg, torch.neg) and len(a) == 1 and isinstance(a[0], fx.Node):
        terms = _linear(a[0], inner)
        if terms is None:
            return None
        inner.append(n)
        return [(x, k, [*f, (operator.neg, None)]) for x, k, f in terms]
    return None


def merge_full_reductions(gm: fx.GraphModule) -> bool:
    """A scalar sum of full reductions of same-shaped float tensors (``mean(l1) + 0.5 * sum(l2) / n +
    mean(l3)``: three losses) as one reduction of their elementwise combination (``sum(l1 / N + 0.5 *
    l2 / n + l3 / N)``, ``N`` the traced element count; ``mean`` where all are means): one pass over the
    inputs, not one per loss. Needs the propagated shapes; True if the graph changed."""
    graph, changed = gm.graph, False
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or node.target not in (
            operator.add,
            operator.sub,
            torch.add,
            torch.sub,
        ):
            continue
        if _meta_shape(node) != () or node.graph is not graph or node not in graph.nodes:
            continue
        inner: list[fx.Node] = []
        terms = _linear(node, inner)
        if terms is None or len(terms) < 2:
            continue
        shapes = {_meta_shape(x) for x, _, _ in terms}
        dtypes = {getattr(x.meta.get("tensor_meta"), "dtype", None) for x, _, _ in terms}
        if len(shapes) != 1 or None in shapes or dtypes != {torch.float32}:
            continue
        if len(set(inner)) != len(inner) or any(len(m.users) != 1 for m in inner if m is not node):
            continue  # a partial result read elsewhere: merging would not save its pass
        kinds = {k for _, k, _ in terms}
        rank = len(next(iter(shapes)) or ())
        with graph.inserting_before(node):
            acc: fx.Node | None = None
            for x, k, factors in terms:
                e: fx.Node = x
                if k == "mean" and len(kinds) > 1:
                    count: Any = 1
                    for d in range(rank):
                        size = graph.call_method("size", (x, d))
                        count = size if d == 0 else graph.call_function(operator.mul, (count, size))
                    e = graph.call_function(operator.truediv, (e, count))
                neg = False
                for op, f in factors:
                    if op is operator.neg:
                        neg = not neg
                    else:
                        e = graph.call_function(op, (e, f))
                if acc is None:
                    acc = graph.call_function(operator.neg, (e,)) if neg else e
                else:
                    acc = graph.call_function(operator.sub if neg else operator.add, (acc, e))
            new = graph.call_function(torch.mean if kinds == {"mean"} else torch.sum, (acc,))
        node.replace_all_uses_with(new)
        for m in reversed(inner):
            if not m.users:
                graph.erase_node(m)
        changed = True
    return changed
