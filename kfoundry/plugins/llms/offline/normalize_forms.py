"""Spellings of a traced reference rewritten into the ops the lowering has (values kept exactly,
NaN and infinities included), on the ``torch.fx`` graph before shapes are propagated:

* **in-place ops** (``x.relu_()``, ``x.mul_(2)``, ``torch.relu_(x)``, ``F.relu(x, inplace=True)``,
  ``nn.ReLU(inplace=True)``): made out of place, and every later use of the tensor they wrote reads
  their result (refused, left as is, where that tensor is a view of another one);
* **aliases**: ``clamp_min``/``clamp_max``/``clip`` are ``clamp``, ``torch.special.expit`` is
  ``sigmoid``, ``swapaxes``/``swapdims`` are ``transpose``, ``absolute``/``negative`` are ``abs``/``neg``;
* **compositions**: ``masked_fill`` is ``where``; ``sign``, ``trunc``, ``frac``, ``hardshrink``,
  ``softshrink``, ``tanhshrink``, ``threshold`` and ``celu`` are ``where``/``floor``/``ceil``/``tanh``/
  ``expm1``; ``stack`` is ``cat`` of ``unsqueeze``; ``&``/``|``/``~`` of comparisons are ``where``;
* a reduction's ``dim=None`` is dropped (``x.mean(dim=None)`` is ``x.mean()``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from kfoundry.plugins.llms.offline.normalize_ops import COMPOSITIONS

__all__ = ["rewrite_forms"]

_VIEWS = {
    "view",
    "reshape",
    "permute",
    "transpose",
    "t",
    "narrow",
    "select",
    "squeeze",
    "unsqueeze",
    "flatten",
    "expand",
    "expand_as",
    "getitem",
    "unflatten",
    "movedim",
    "swapaxes",
    "diagonal",
    "split",
    "chunk",
    "unbind",
    "view_as",
}
_ALIASES: dict[Any, Any] = {
    torch.clip: torch.clamp,
    torch.special.expit: torch.sigmoid,
    torch.absolute: torch.abs,
    torch.negative: torch.neg,
    torch.swapaxes: torch.transpose,
    torch.swapdims: torch.transpose,
}
_METHOD_ALIASES = {"clip": "clamp", "swapaxes": "transpose", "swapdims": "transpose", "absolute": "abs"}
_COMPARES = {"gt", "lt", "ge", "le", "eq", "ne", "greater", "less", "logical_not", "isnan", "isinf"}
#: Tensor methods that are the function of the same name with the tensor first.
_METHOD_FUNCTIONS: dict[str, Any] = {
    "diff": torch.diff,
    "lerp": torch.lerp,
    "addcmul": torch.addcmul,
    "logit": torch.logit,
    "nan_to_num": torch.nan_to_num,
    "outer": torch.outer,
    "ger": torch.ger,
}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "prod", "std", "var", "logsumexp", "max", "min", "norm"}


def _name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return str(getattr(node.target, "__name__", node.target))
    return ""


def rewrite_forms(gm: fx.GraphModule) -> bool:
    """Rewrite ``gm`` in place (see the module docstring); True if anything changed."""
    changed, again = False, True
    for _ in range(4):  # a rewritten node may be rewritten again (``x.clamp_min_(a)``)
        if not again:
            break
        again = False
        for node in list(gm.graph.nodes):
            if node.graph is not gm.graph or node.op not in ("call_function", "call_method", "call_module"):
                continue
            for rule in (_inplace, _alias, _module, _pick, _clamp_bound, _drop_none_dim, _compose):
                if rule(gm, node) is not None:
                    changed = again = True
                    break
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def _replace(graph: fx.Graph, old: fx.Node, make: Callable[[], fx.Node]) -> fx.Node:
    with graph.inserting_before(old):
        new = make()
    old.replace_all_uses_with(new)
    new.meta = dict(old.meta)
    graph.erase_node(old)
    return new


def _call(graph: fx.Graph, fn: Any, *args: Any, **kwargs: Any) -> fx.Node:
    return graph.call_function(fn, args, kwargs)


# -- in-place ops -------------------------------------------------------------------------------


def _inplace(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    name = _name(node)
    mod = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
    method = node.op == "call_method" and name.endswith("_") and not name.startswith("_")
    function = node.op == "call_function" and name.endswith("_") and not name.startswith("_")
    flag = node.kwargs.get("inplace") is True or (mod is not None and getattr(mod, "inplace", False) is True)
    if not (method or function or flag) or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    target = node.args[0]
    if function and not hasattr(torch, name[:-1]):
        return None
    if method and not hasattr(torch.Tensor, name[:-1]):
        return None
    if _is_view(target) and _later_users(target, node, include_base=True):
        return None  # writing through a view into a tensor read later: left for the lowering to refuse
    graph = gm.graph
    later = _later_users(target, node)
    if method:
        new = _replace(graph, node, lambda: graph.call_method(name[:-1], node.args, dict(node.kwargs)))
    elif function:
        new = _replace(
            graph, node, lambda: _call(graph, getattr(torch, name[:-1]), *node.args, **node.kwargs)
        )
    else:
        new = node
        if "inplace" in node.kwargs:
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "inplace"}
    for user in later:
        user.replace_input_with(target, new)
    return new


def _is_view(node: fx.Node) -> bool:
    return node.op in ("call_method", "call_function") and (
        _name(node) in _VIEWS or node.target is operator.getitem
    )


def _later_users(target: fx.Node, node: fx.Node, include_base: bool = False) -> list[fx.Node]:
    """Users of ``target`` (and of the tensors it views, with ``include_base``) after ``node``."""
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    bases = [target]
    while include_base and _is_view(bases[-1]) and isinstance(bases[-1].args[0], fx.Node):
        bases.append(bases[-1].args[0])
    return [u for b in bases for u in b.users if u is not node and order[u] > order[node]]


# -- modules as functions, picks of tuple ops ---------------------------------------------------


def _module(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """``nn.PReLU``, ``nn.Hardshrink``, ``nn.Softshrink``, ``nn.Tanhshrink``, ``nn.Threshold``,
    ``nn.CELU``, ``nn.Softplus``, ``nn.GLU`` and ``nn.RMSNorm`` as their functions (rewritten further by the rules here)."""
    if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
        return None
    mod: Any = gm.get_submodule(str(node.target))
    graph, x = gm.graph, node.args[0]
    kind = type(mod).__name__
    made: Callable[[], fx.Node] | None = None
    if kind == "PReLU":
        made = lambda: _call(graph, F.prelu, x, graph.get_attr(f"{node.target}.weight"))  # noqa: E731
    elif kind in ("Hardshrink", "Softshrink"):
        fn = F.hardshrink if kind == "Hardshrink" else F.softshrink
        made = lambda: _call(graph, fn, x, float(mod.lambd))  # noqa: E731
    elif kind == "Tanhshrink":
        made = lambda: _call(graph, F.tanhshrink, x)  # noqa: E731
    elif kind == "Threshold":
        made = lambda: _call(graph, F.threshold, x, float(mod.threshold), float(mod.value))  # noqa: E731
    elif kind == "CELU":
        made = lambda: _call(graph, F.celu, x, float(mod.alpha))  # noqa: E731
    elif kind == "Softplus":
        made = lambda: _call(graph, F.softplus, x, float(mod.beta), float(mod.threshold))  # noqa: E731
    elif kind == "GLU":
        made = lambda: _call(graph, F.glu, x, int(mod.dim))  # noqa: E731
    elif kind == "RMSNorm":
        weight = f"{node.target}.weight" if getattr(mod, "weight", None) is not None else None
        shape = tuple(mod.normalized_shape)
        made = lambda: _call(  # noqa: E731
            graph, F.rms_norm, x, shape, graph.get_attr(weight) if weight else None, mod.eps
        )
    if made is None:
        return None
    return _replace(graph, node, made)


def _pick(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """``x.unbind(d)[i]`` is ``x.select(d, i)``; ``torch.chunk(x, c, d)[i]`` for ``i < c - 1`` is
    ``x.narrow(d, i * k, k)`` with ``k = ceil(x.size(d) / c)``."""
    if node.op != "call_function" or node.target is not operator.getitem or not isinstance(node.args[1], int):
        return None
    src, i = node.args[0], int(node.args[1])
    if not isinstance(src, fx.Node) or not isinstance(src.args[0] if src.args else None, fx.Node):
        return None
    graph, name, x = gm.graph, _name(src), src.args[0]
    if name == "unbind":
        dim = int(_arg(src, 1, "dim", 0))
        new = _replace(graph, node, lambda: graph.call_method("select", (x, dim, i)))
    elif name == "chunk":
        c, dim = int(_arg(src, 1, "chunks", 1)), int(_arg(src, 2, "dim", 0))
        if not 0 <= i < c - 1:
            return None

        def piece() -> fx.Node:
            n = graph.call_method("size", (x, dim))
            k = _call(graph, operator.floordiv, _call(graph, operator.add, n, c - 1), c)
            return graph.call_method("narrow", (x, dim, _call(graph, operator.mul, k, i), k))

        new = _replace(graph, node, piece)
    else:
        return None
    if not src.users:
        graph.erase_node(src)
    return new


# -- aliases ------------------------------------------------------------------------------------


def _alias(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    graph = gm.graph
    if node.op == "call_function" and node.target in _ALIASES:
        fn = _ALIASES[node.target]
        return _replace(graph, node, lambda: _call(graph, fn, *node.args, **node.kwargs))
    if node.op == "call_method" and node.target in _METHOD_ALIASES:
        name = _METHOD_ALIASES[str(node.target)]
        return _replace(graph, node, lambda: graph.call_method(name, node.args, dict(node.kwargs)))
    return None


def _clamp_bound(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """``clamp_min(x, a)`` is ``clamp(x, min=a)``; ``clamp_max(x, b)`` is ``clamp(x, max=b)``."""
    name = _name(node)
    if name not in ("clamp_min", "clamp_max") or len(node.args) < 1:
        return None
    key = name.removeprefix("clamp_")
    bound = node.args[1] if len(node.args) > 1 else node.kwargs.get(key)
    if bound is None:
        return None
    graph = gm.graph
    return _replace(graph, node, lambda: _call(graph, torch.clamp, node.args[0], **{key: bound}))


def _drop_none_dim(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    if _name(node) not in _REDUCTIONS or "dim" not in node.kwargs or node.kwargs["dim"] is not None:
        return None
    node.kwargs = {k: v for k, v in node.kwargs.items() if k != "dim"}
    return node


# -- compositions -------------------------------------------------------------------------------


def _arg(node: fx.Node, pos: int, key: str, default: Any) -> Any:
    if key in node.kwargs:
        return node.kwargs[key]
    return node.args[pos] if len(node.args) > pos else default


def _compose(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    graph = gm.graph
    name = _name(node)
    fnode = node.op == "call_function"
    composed = COMPOSITIONS.get(node.target if fnode else _METHOD_FUNCTIONS.get(name))
    if composed is not None:
        with graph.inserting_before(node):
            new = composed(graph, node)
        if new is None:
            return None
        node.replace_all_uses_with(new)
        new.meta = dict(node.meta)
        graph.erase_node(node)
        return new
    if name == "masked_fill" and len(node.args) + len(node.kwargs) == 3:
        x, mask, value = node.args[0], _arg(node, 1, "mask", None), _arg(node, 2, "value", None)
        return _replace(graph, node, lambda: _call(graph, torch.where, mask, value, x))
    if name == "stack" and fnode:
        parts, dim = _arg(node, 0, "tensors", None), _arg(node, 1, "dim", 0)
        if not isinstance(parts, list | tuple) or not isinstance(dim, int):
            return None

        def stacked() -> fx.Node:
            return _call(graph, torch.cat, [_call(graph, torch.unsqueeze, p, dim) for p in parts], dim)

        return _replace(graph, node, stacked)
    if name in ("and_", "or_", "xor", "invert") and fnode:
        ops = [a for a in node.args if isinstance(a, fx.Node)]
        if len(ops) != len(node.args) or not all(_name(a) in _COMPARES for a in ops):
            return None
        a = ops[0]
        if name == "invert":
            return _replace(graph, node, lambda: _call(graph, torch.eq, a, 0))
        b = ops[1]
        how = {"and_": (b, a), "or_": (a, b)}.get(name)
        if how is None:
            return _replace(graph, node, lambda: _call(graph, torch.ne, a, b))
        return _replace(graph, node, lambda: _call(graph, torch.where, a, *how))
    make = _ELEMENTWISE.get(node.target) if fnode else None
    if make is None and node.op == "call_method":
        make = _METHODS.get(name)
    if make is None or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    return _replace(graph, node, lambda: make(graph, node))


def _sign(g: fx.Graph, n: fx.Node) -> fx.Node:  # sign(NaN) is 0, as torch's
    x = n.args[0]
    neg = _call(g, torch.where, _call(g, operator.lt, x, 0.0), -1.0, 0.0)
    return _call(g, torch.where, _call(g, operator.gt, x, 0.0), 1.0, neg)


def _trunc(g: fx.Graph, n: fx.Node) -> fx.Node:
    x = n.args[0]
    return _call(
        g, torch.where, _call(g, operator.lt, x, 0.0), _call(g, torch.ceil, x), _call(g, torch.floor, x)
    )


def _frac(g: fx.Graph, n: fx.Node) -> fx.Node:
    return _call(g, operator.sub, n.args[0], _trunc(g, n))


def _hardshrink(g: fx.Graph, n: fx.Node) -> fx.Node:
    x, lam = n.args[0], float(_arg(n, 1, "lambd", 0.5))
    inner = _call(g, torch.where, _call(g, operator.le, x, lam), 0.0, x)
    return _call(g, torch.where, _call(g, operator.ge, x, -lam), inner, x)


def _softshrink(g: fx.Graph, n: fx.Node) -> fx.Node:  # NaN stays NaN: x * 0
    x, lam = n.args[0], float(_arg(n, 1, "lambd", 0.5))
    low = _call(
        g,
        torch.where,
        _call(g, operator.lt, x, -lam),
        _call(g, operator.add, x, lam),
        _call(g, operator.mul, x, 0.0),
    )
    return _call(g, torch.where, _call(g, operator.gt, x, lam), _call(g, operator.sub, x, lam), low)


def _tanhshrink(g: fx.Graph, n: fx.Node) -> fx.Node:
    return _call(g, operator.sub, n.args[0], _call(g, torch.tanh, n.args[0]))


def _threshold(g: fx.Graph, n: fx.Node) -> fx.Node:
    x, th, value = n.args[0], float(_arg(n, 1, "threshold", 0.0)), float(_arg(n, 2, "value", 0.0))
    return _call(g, torch.where, _call(g, operator.le, x, th), value, x)


def _celu(g: fx.Graph, n: fx.Node) -> fx.Node:
    x, alpha = n.args[0], float(_arg(n, 1, "alpha", 1.0))
    neg = _call(g, operator.mul, _call(g, torch.expm1, _call(g, operator.truediv, x, alpha)), alpha)
    return _call(g, torch.where, _call(g, operator.gt, x, 0.0), x, neg)


_ELEMENTWISE: dict[Any, Callable[[fx.Graph, fx.Node], fx.Node]] = {
    torch.sign: _sign,
    torch.trunc: _trunc,
    torch.fix: _trunc,
    torch.frac: _frac,
    F.hardshrink: _hardshrink,
    torch.hardshrink: _hardshrink,
    F.softshrink: _softshrink,
    F.tanhshrink: _tanhshrink,
    F.threshold: _threshold,
    torch.threshold: _threshold,
    F.celu: _celu,
    torch.celu: _celu,
}
_METHODS: dict[str, Callable[[fx.Graph, fx.Node], fx.Node]] = {
    "sign": _sign,
    "trunc": _trunc,
    "fix": _trunc,
    "frac": _frac,
    "hardshrink": _hardshrink,
    "softshrink": _softshrink,
}
