"""Rewrite forms of a traced KernelBench reference that the lowering does not need to know about.

Run on the ``torch.fx`` graph right after tracing, before shapes are propagated (first the
spellings of :mod:`.normalize_forms`: in-place ops, aliases, compositions):

* **Scalar tensor constants.** ``torch.tensor(0.5)`` in ``forward`` is traced as an ``fx`` constant
  attribute (``_tensor_constant0``), one with ``device=x.device`` or ``dtype=x.dtype`` as a
  ``torch.tensor`` call on a ``getattr`` node. Neither exists on the reference module that the
  generated model holds. A one-element constant used by an elementwise op becomes a plain Python
  number (``x + t`` is ``x + 0.5``); ``torch.min``/``torch.max``/``minimum``/``maximum`` of a tensor
  and such a constant become ``torch.clamp`` (same values, NaN propagated the same way); any other
  use becomes ``torch.full_like`` of the op's tensor operand.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from kfoundry.core.generator import GeneratorUnsupported
from kfoundry.plugins.llms.offline.normalize_forms import rewrite_forms
from kfoundry.plugins.llms.offline.normalize_linear_sum import sum_of_affine_product
from kfoundry.plugins.llms.offline.normalize_ops import merge_full_reductions

__all__ = ["normalize", "with_shapes"]

#: Elementwise ops that take a Python number wherever they take a tensor operand.
_NUMBER_OK: set[Any] = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.pow,
    operator.floordiv,
    operator.mod,
    torch.add,
    torch.sub,
    torch.subtract,
    torch.mul,
    torch.multiply,
    torch.div,
    torch.divide,
    torch.true_divide,
    torch.pow,
    torch.where,
    torch.remainder,
    torch.fmod,
}
_NUMBER_OK_METHODS = {"add", "sub", "mul", "div", "pow", "subtract", "multiply", "divide", "true_divide"}
#: (function or method name, clamp keyword): ``torch.min(x, c)`` is ``torch.clamp(x, max=c)``.
_CLAMPS: dict[Any, str] = {torch.min: "max", torch.minimum: "max", torch.max: "min", torch.maximum: "min"}
_CLAMP_METHODS = {"min": "max", "minimum": "max", "max": "min", "maximum": "min"}
#: Tensor factories whose value does not depend on the tensors they take ``device``/``dtype`` from.
_FACTORIES = {torch.tensor, torch.scalar_tensor, torch.as_tensor}


def normalize(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` rewritten in place (see the module docstring) and recompiled; returned for chaining."""
    changed = rewrite_forms(gm)
    for node in list(gm.graph.nodes):
        value = _scalar_constant(gm, node)
        if value is None:
            continue
        for user in list(node.users):
            changed |= _replace_use(gm.graph, user, node, value)
        if not node.users:
            _erase_with_dead_inputs(gm.graph, node)
            changed = True
    left = [n for n in gm.graph.nodes if n.op == "get_attr" and str(n.target).startswith("_tensor_constant")]
    if left:  # the generated model holds the reference's parameters, not constants made by tracing
        raise GeneratorUnsupported(
            f"offline generator: a tensor constant made in forward ({left[0].name}: more than one element, "
            "or used where no other tensor gives its shape) is not in the cookbook"
        )
    if changed:
        for name in [n for n in dir(gm) if n.startswith("_tensor_constant")]:
            if not any(n.op == "get_attr" and n.target == name for n in gm.graph.nodes):
                delattr(gm, name)
        gm.graph.lint()
        gm.recompile()
    return gm


def _scalar_constant(gm: fx.GraphModule, node: fx.Node) -> float | int | bool | None:
    """The Python value of a one-element tensor constant made in ``forward`` (None for anything else)."""
    if node.op == "get_attr" and str(node.target).startswith("_tensor_constant"):
        t = getattr(gm, str(node.target), None)
    elif node.op == "call_function" and node.target in _FACTORIES:
        if len(node.args) != 1 or isinstance(node.args[0], fx.Node) or _has_node(node.args[0]):
            return None
        if any(k not in ("device", "dtype", "requires_grad") for k in node.kwargs):
            return None
        dtype = node.kwargs.get("dtype")
        try:
            t = torch.tensor(node.args[0], dtype=dtype if isinstance(dtype, torch.dtype) else None)
        except (TypeError, ValueError, RuntimeError):
            return None
    else:
        return None
    if not isinstance(t, torch.Tensor) or t.numel() != 1 or t.is_complex() or t.is_meta:
        return None
    out: float | int | bool = t.item()
    return out


def _has_node(arg: Any) -> bool:
    found = False

    def visit(a: Any) -> Any:
        nonlocal found
        found |= isinstance(a, fx.Node)
        return a

    fx.node.map_aggregate(arg, visit)
    return found


def _tensor_operands(user: fx.Node, const: fx.Node) -> list[fx.Node]:
    return [a for a in (*user.args, *user.kwargs.values()) if isinstance(a, fx.Node) and a is not const]


def _replace_use(graph: fx.Graph, user: fx.Node, const: fx.Node, value: float | int | bool) -> bool:
    """Rewrite ``user``'s use of the constant ``const``; False where it is left as it is."""
    others = _tensor_operands(user, const)
    fn = user.target if user.op == "call_function" else None
    method = str(user.target) if user.op == "call_method" else None
    clamp = _CLAMPS.get(fn) if fn is not None else _CLAMP_METHODS.get(method or "")
    binary = len(user.args) == 2 and not user.kwargs and const in user.args
    if clamp is not None and binary and len(others) == 1:
        with graph.inserting_before(user):
            new = graph.call_function(torch.clamp, (others[0],), {clamp: value})
        user.replace_all_uses_with(new)
        new.meta = dict(user.meta)
        graph.erase_node(user)
        return True
    on_const = method is not None and bool(user.args) and user.args[0] is const  # ``t.sub(x)``: full_like
    number_ok = fn in _NUMBER_OK or method in _NUMBER_OK_METHODS
    if number_ok and others and not isinstance(value, bool) and not on_const:
        user.replace_input_with(const, value)  # type: ignore[arg-type]
        return True
    if not others:
        return False
    with graph.inserting_before(user):
        full = graph.call_function(torch.full_like, (others[0], value))
    user.replace_input_with(const, full)
    return True


def _erase_with_dead_inputs(graph: fx.Graph, node: fx.Node) -> None:
    """Erase ``node`` and then its ``getattr`` inputs (``x.device``) that no longer have users."""
    inputs = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
    graph.erase_node(node)
    for a in inputs:
        if not a.users and a.op == "call_function" and a.target is getattr:
            graph.erase_node(a)


def with_shapes(gm: fx.GraphModule) -> bool:
    """Rewrites that need the propagated shapes and dtypes (run after ``ShapeProp``; True if the graph
    changed and shapes must be propagated again): ``y.dtype`` as an argument is the dtype it was traced
    with; ``x.type_as(y)`` is ``x.to(dtype)``; ``movedim`` with int dims is ``permute``; ``max``/``min`` over a negative dim count it
    from 0; ``F.prelu`` is
    ``where(x >= 0, x, weight * x)`` with the weight over the channel dimension; a sum over the features of an
    affine map of a matrix product is a matrix-vector product (:mod:`.normalize_linear_sum`)."""
    changed = False
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is getattr and node.args[1] == "dtype":
            meta = getattr(node.args[0], "meta", {}).get("tensor_meta")
            if meta is not None and hasattr(meta, "dtype"):
                node.replace_all_uses_with(meta.dtype)
                graph.erase_node(node)
                changed = True
        elif _name(node) in ("max", "min") and isinstance(_arg(node, 1, "dim"), int) and _rank(node.args[0]):
            dim, nd = _arg(node, 1, "dim"), _rank(node.args[0]) or 1
            if dim < 0:  # ``x.max(dim=-1).values``: the (values, indices) pair with its dim counted from 0
                if "dim" in node.kwargs:
                    node.kwargs = {**node.kwargs, "dim": dim % nd}
                else:
                    node.args = (node.args[0], dim % nd, *node.args[2:])
                changed = True
        elif node.op == "call_method" and node.target == "type_as" and len(node.args) == 2:
            meta = getattr(node.args[1], "meta", {}).get("tensor_meta")
            if meta is not None and hasattr(meta, "dtype"):
                node.target, node.args = "to", (node.args[0], meta.dtype)
                changed = True
        elif _name(node) == "movedim" and _rank(node.args[0]) is not None:
            rank, src, dst = _rank(node.args[0]), _arg(node, 1, "source"), _arg(node, 2, "destination")
            if isinstance(src, int) and isinstance(dst, int) and rank:
                order = [d for d in range(rank) if d != src % rank]
                order.insert(dst % rank, src % rank)
                with graph.inserting_before(node):
                    new = graph.call_method("permute", (node.args[0], *order))
                node.replace_all_uses_with(new)
                graph.erase_node(node)
                changed = True
        elif node.op == "call_function" and node.target in (F.prelu, torch.prelu) and _rank(node.args[0]):
            x, w = node.args[0], node.args[1]
            ones = [1] * max(0, (_rank(x) or 2) - 2)
            with graph.inserting_before(node):
                wv = graph.call_method("reshape", (w, -1, *ones)) if ones else w
                neg = graph.call_function(operator.mul, (wv, x))
                new = graph.call_function(torch.where, (graph.call_function(operator.ge, (x, 0.0)), x, neg))
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            changed = True
    changed |= merge_full_reductions(gm)
    changed |= sum_of_affine_product(gm)
    if changed:
        graph.lint()
        gm.recompile()
    return changed


def _name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    return str(getattr(node.target, "__name__", "")) if node.op == "call_function" else ""


def _arg(node: fx.Node, pos: int, key: str) -> Any:
    return node.kwargs[key] if key in node.kwargs else node.args[pos] if len(node.args) > pos else None


def _rank(a: Any) -> int | None:
    meta = a.meta.get("tensor_meta") if isinstance(a, fx.Node) else None
    return len(meta.shape) if meta is not None and hasattr(meta, "shape") else None
