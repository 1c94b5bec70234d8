"""Recognise fp32 matrix-product variants of two forward inputs ``a``, ``b`` (family ``gemm``, recipes in
:mod:`.cookbook_mm_variants`): ``bmm`` / 3-D ``matmul`` (a batch of 1 broadcasts), ``einsum`` of a batch
(``bij,bjk->bik``) or of an N-D tensor and a matrix (``...l,lk->...k``), ``a.T`` / ``b.T`` operands of a
2-D product, ``tril`` / ``triu`` of the product and ``diag(a) @ b``, each optionally followed by an
elementwise epilogue of the product alone. The plain products :func:`.recognize._matmul` already handles
are left to it (None)."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from kfoundry.core.generator import GeneratorUnsupported

_MM = (torch.matmul, torch.mm, operator.matmul)


def _is_product(n: fx.Node) -> bool:
    if n.op == "call_function":
        return n.target in (*_MM, torch.bmm, torch.einsum)
    return n.op == "call_method" and n.target in ("matmul", "mm", "bmm")


def _transposed(n: Any, shape: list[int]) -> Any:
    """The placeholder ``n`` transposes (a 2-D ``.T`` / ``.t()`` / ``transpose(0, 1)``), else None."""
    if not isinstance(n, fx.Node) or len(shape) != 2:
        return None
    src = n.args[0] if n.args else None
    if n.op == "call_function" and n.target is getattr and n.args[1:] in (("T",), ("mT",)):
        return src
    if n.op == "call_method" and n.target == "t" and len(n.args) == 1:
        return src
    if n.op == "call_method" and n.target == "transpose":
        dims = [a for a in n.args[1:] if isinstance(a, int)]
        if len(dims) == 2 == len(n.args) - 1 and sorted(a % 2 for a in dims) == [0, 1]:
            return src
    if n.op == "call_function" and n.target in (torch.t,) and len(n.args) == 1:
        return src
    return None


def _einsum_kind(eq: str) -> str | None:
    """``flat`` (``...l,lk->...k``), ``batch`` (``bij,bjk->bik``) or None."""
    eq = eq.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    ins, out = eq.split("->")
    parts = ins.split(",")
    if len(parts) != 2:
        return None
    x, y = parts
    if len(set(x)) != len(x) or len(set(y)) != len(y) or len(set(out)) != len(out):
        return None
    if len(y) == 2 and len(x) >= 2 and x[-1] == y[0] and y[1] not in x and out == x[:-1] + y[1]:
        return "flat"
    if (
        len(x) == len(y) == len(out) == 3
        and (y[0], y[1]) == (x[0], x[2])
        and y[2] not in x
        and out == x[:2] + y[2]
    ):
        return "batch"
    return None


def matmul_variant(t: Any, anchors: list[fx.Node]) -> Any:
    """The ``gemm`` :class:`.recognize.OpSpec` of trace ``t``, or None (not a variant, or a plain product)."""
    from kfoundry.plugins.llms.offline.recognize import OpSpec, _expr_over

    if t.half or not t.float_only or len(t.placeholders) != 2 or t.modules:
        return None
    pa, pb = t.placeholders
    prods = [n for n in anchors if _is_product(n)]
    if len(prods) != 1:
        return None
    mm = prods[0]
    x: Any
    y: Any
    node: Any
    dims: dict[str, int] = {"mmv": 1}
    end = mm
    tri = [n for n in anchors if n.op == "call_function" and n.target in (torch.tril, torch.triu)]
    tri += [n for n in anchors if n.op == "call_method" and n.target in ("tril", "triu")]
    if tri:
        if len(tri) != 1 or tri[0].args[0] is not mm or len(mm.users) != 1:
            return None
        node = tri[0]
        dg = node.kwargs.get("diagonal", node.args[1] if len(node.args) > 1 else 0)
        if not isinstance(dg, int) or isinstance(dg, bool) or len(t.shape(mm)) != 2:
            return None
        dims["tri"] = 1 if getattr(node.target, "__name__", node.target) == "tril" else 2
        dims["dg"] = dg
        end = node
    if mm.op == "call_function" and mm.target is torch.einsum:
        eq, *ops = mm.args
        if not isinstance(eq, str) or len(ops) != 2 or mm.kwargs:
            return None
        kind = _einsum_kind(eq)
        if kind is None:
            return None
        x, y = ops
        dims["batch" if kind == "batch" else "flat"] = 1
    else:
        if len(mm.args) != 2 or mm.kwargs:
            return None
        x, y = mm.args
    others = {n for n in anchors if n not in (mm, end)}
    # operands: a (or a.T, or diag(a)) and b (or b.T)
    xs, ys = t.shape(x), t.shape(y)
    if x is not pa:
        src = _transposed(x, xs)
        if src is pa:
            dims["ta"] = 1
        elif (
            isinstance(x, fx.Node)
            and x.op == "call_function"
            and x.target is torch.diag
            and x.args[0] is pa
            and len(x.args) == 1
            and not x.kwargs
            and len(t.shape(pa)) == 1
        ):
            dims["diag"] = 1
        else:
            return None
        others.discard(x)
        if len(x.users) != 1:
            return None
    if y is not pb:
        if _transposed(y, ys) is not pb:
            return None
        dims["tb"] = 1
        others.discard(y)
        if len(y.users) != 1:
            return None
    if others:
        return None
    a_s, b_s = t.shape(pa), t.shape(pb)
    if dims.get("diag") and (dims.get("tri") or dims.get("tb") or len(b_s) != 2):
        return None
    if not dims.get("diag"):
        if len(b_s) == 3 and len(a_s) == 3 and not (dims.get("ta") or dims.get("tb")):
            if a_s[0] != b_s[0] and 1 not in (a_s[0], b_s[0]):
                return None
            if mm.target is torch.bmm and a_s[0] != b_s[0]:
                return None
            dims["batch"] = 1
        elif len(b_s) != 2 or len(a_s) < 2 or (len(a_s) > 2 and dims.get("ta")):
            return None
        elif len(a_s) > 3:
            dims["flat"] = 1
    plain = not any(dims.get(k) for k in ("ta", "tb", "batch", "tri", "diag", "flat"))
    if plain:  # A @ B of 2-D (or [.., M, K] @ [K, N]) inputs: recognize._matmul's recipes
        return None
    if dims.get("diag"):
        (K, N), M = b_s, a_s[0]
    elif dims.get("batch"):
        M, K, N = a_s[1], a_s[2], b_s[2]
        dims["batch"] = max(a_s[0], b_s[0])
    else:
        K = a_s[0] if dims.get("ta") else a_s[-1]
        M = a_s[1] if dims.get("ta") else int(torch.Size(a_s).numel()) // max(1, K)
        N = b_s[0] if dims.get("tb") else b_s[1]
    start = {n for n in t.nodes if t.nodes.index(n) <= t.nodes.index(end)}
    expr = (lambda lang: _expr_over(t, {end: "v"}, start, lang)) if t.out is not end else None
    if expr is not None:
        try:
            expr("opencl")
        except GeneratorUnsupported:
            return None
    return OpSpec(
        family="gemm",
        input_shapes=[list(x.shape) for x in t.inputs],
        output_shape=t.shape(t.out),
        expr=expr,
        M=int(M),
        N=int(N),
        K=int(K),
        mm=dims,
        # the lowered graph's recipes too (:mod:`.cookbook_graph`)
        graph=t.gm,
        source=t.source,
        dims={k: v for k, v in t.shapes.items() if isinstance(v, int)},
    )
