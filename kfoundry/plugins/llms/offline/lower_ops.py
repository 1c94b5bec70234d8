"""Op recipes of the lowering: views (loaders) and anchors (kernels) for one fx node each.

Long reductions accumulate in chunks (a partial sum per chunk of ``CHUNK`` terms, added to the
total: error grows with ``n / CHUNK + CHUNK`` instead of ``n``); scans use compensated (Kahan)
sums; max/min and arg-max/min propagate NaN as torch does.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from kfoundry.core.generator import GeneratorUnsupported
from kfoundry.plugins.llms.offline import (
    lower_colsoftmax,
    lower_conv,
    lower_group,
    lower_mm_direct,
    lower_scan,
    lower_split,
    lower_stats,
)
from kfoundry.plugins.llms.offline.elementwise_ops import fn, lit
from kfoundry.plugins.llms.offline.lower import PyVal, Val, _shape, horner, ref_path, unflat

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering

CHUNK = 64
#: Before a row loop: four iterations' loads in flight together (a loop's trip count is known only at run time).
UNROLL4 = '_Pragma("unroll 4")'


def _args(node: fx.Node) -> list[Any]:
    return list(node.args)


def _kwargs(node: fx.Node) -> dict[str, Any]:
    return dict(node.kwargs)


def _unsupported(what: str) -> GeneratorUnsupported:
    return GeneratorUnsupported(f"offline generator: {what} is not in the cookbook")


def _pyexpr(L: Lowering, a: Any) -> str:
    if isinstance(a, fx.Node):
        v = L.value(a)
        if isinstance(v, PyVal):
            return v.expr
        raise _unsupported("a tensor used as a Python value")
    if isinstance(a, list | tuple):
        inner = ", ".join(_pyexpr(L, x) for x in a)
        return f"({inner},)" if isinstance(a, tuple) else f"[{inner}]"
    return repr(a)


def _pyval(L: Lowering, a: Any) -> Any:
    if isinstance(a, fx.Node):
        v = L.value(a)
        if isinstance(v, PyVal):
            return v.value
        raise _unsupported("a tensor used as a Python value")
    if isinstance(a, list | tuple):
        return type(a)(_pyval(L, x) for x in a)
    return a


_PY_OPS: dict[Any, str] = {
    operator.floordiv: "//",
    operator.mul: "*",
    operator.add: "+",
    operator.sub: "-",
    operator.truediv: "/",
    operator.mod: "%",
    operator.pow: "**",
}


def py_value(L: Lowering, node: fx.Node) -> PyVal:
    """A Python value node (sizes, shapes and arithmetic on them)."""
    n = L.order[node]
    t, args = node.target, _args(node)
    if node.op == "call_method" and t == "size":
        src = f"S{L.order[args[0]]}"
        shape = _shape(args[0])
        d = _kwargs(node).get("dim", args[1] if len(args) > 1 else None)
        expr, value = (src, shape) if d is None else (f"{src}[{d}]", shape[int(d)])
    elif node.op == "call_method" and t == "dim":
        shape = _shape(args[0])
        expr, value = f"len(S{L.order[args[0]]})", len(shape)
    elif node.op == "call_function" and t is getattr and args[1] in ("shape", "ndim"):
        shape = _shape(args[0])
        src = f"S{L.order[args[0]]}"
        expr, value = (src, shape) if args[1] == "shape" else (f"len({src})", len(shape))
    elif node.op == "call_function" and t is operator.getitem:
        expr, value = f"{_pyexpr(L, args[0])}[{_pyexpr(L, args[1])}]", _pyval(L, args[0])[_pyval(L, args[1])]
    elif node.op == "call_function" and t in _PY_OPS:
        a, b = _pyval(L, args[0]), _pyval(L, args[1])
        expr, value = (
            f"({_pyexpr(L, args[0])} {_PY_OPS[t]} {_pyexpr(L, args[1])})",
            eval(  # noqa: S307
                f"a {_PY_OPS[t]} b", {"a": a, "b": b}
            ),
        )
    elif node.op == "call_function" and t in _PY_MATH and len(args) == 1:
        # math.sqrt(q.size(-1)) and the like: computed in forward from the sizes
        expr, value = f"math.{t.__name__}({_pyexpr(L, args[0])})", t(_pyval(L, args[0]))
    else:
        raise _unsupported(f"op {getattr(t, '__name__', t)}")
    L.fwd(f"P{n} = {expr}")
    return PyVal(value, f"P{n}")


_PY_MATH = (math.sqrt, math.log, math.exp, math.floor, math.ceil, math.log2)


# -- dispatch ------------------------------------------------------------------------------------


def _target_name(L: Lowering, node: fx.Node) -> tuple[str, Any]:
    """(a canonical op name, the module for call_module)."""
    if node.op == "call_module":
        mod = L.gm.get_submodule(str(node.target))
        return type(mod).__name__, mod
    if node.op == "call_method":
        return f"method.{node.target}", None
    t = node.target
    where = getattr(t, "__module__", "") or ""
    name = getattr(t, "__name__", str(t))
    if t is getattr:
        return f"getattr.{_args(node)[1]}", None
    if t is operator.getitem:
        return "getitem", None
    if t is operator.matmul:
        return "matmul", None
    prefix = "F" if "functional" in where else "torch"
    return f"{prefix}.{name}", None


def _arg(node: fx.Node, pos: int, name: str, default: Any = None) -> Any:
    if name in _kwargs(node):
        return _kwargs(node)[name]
    return _args(node)[pos] if len(_args(node)) > pos else default


def lower_node(L: Lowering, node: fx.Node) -> Val:
    name, mod = _target_name(L, node)
    key = name.split(".")[-1]
    n = L.order[node]
    if mod is not None:
        handler = _MODULE_OPS.get(name)
        if handler is None:
            raise _unsupported(f"module nn.{name}")
        return handler(L, node, mod, ref_path(str(node.target)))
    if name == "getitem":
        return _getitem(L, node)
    if name in ("getattr.values", "getattr.indices") and isinstance(L.vals.get(_args(node)[0]), _Pending):
        return L.vals[_args(node)[0]].pick(0 if name == "getattr.values" else 1)
    for table in (_VIEW_OPS, _ANCHOR_OPS):
        if key in table and (name.startswith(("method.", "torch.", "F.", "getattr.")) or name == "matmul"):
            return table[key](L, node)
    if name == "matmul":
        return _matmul(L, node)
    raise _unsupported(f"op {name} (node {node.name}, #{n})")


# -- views ---------------------------------------------------------------------------------------


def _same_order(L: Lowering, node: fx.Node, src: Val, shape_expr: str) -> Val:
    n = L.order[node]
    L.fwd(f"S{n} = {shape_expr}")
    out = _shape(node)
    if src.buffer is not None:
        return L.buffer_val(src.buffer, out, f"S{n}", src.ctype)
    dims = L.shape_dims(f"S{n}", out)
    return Val(out, dims, lambda c: src.load(unflat(horner(c, dims), src.dims)), f"S{n}", src.ctype)


def _reshape(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    if node.target in (torch.reshape,) and len(_args(node)) == 2:
        args = _pyexpr(L, _args(node)[1])
        return _same_order(L, node, src, f"_reshape(S{L.order[_args(node)[0]]}, ({args},))")
    args = ", ".join(_pyexpr(L, a) for a in _args(node)[1:])
    return _same_order(L, node, src, f"_reshape(S{L.order[_args(node)[0]]}, ({args},))")


def _flatten(L: Lowering, node: fx.Node, start: int | None = None, end: int | None = None) -> Val:
    src = L.tensor(_args(node)[0])
    s = start if start is not None else int(_arg(node, 1, "start_dim", 0))
    e = end if end is not None else int(_arg(node, 2, "end_dim", -1))
    S = f"S{L.order[_args(node)[0]]}"
    nd = len(src.shape)
    s, e = s % max(nd, 1), e % max(nd, 1)
    return _same_order(L, node, src, f"{S}[:{s}] + (_prod({S}[{s}:{e + 1}]),) + {S}[{e + 1}:]")


def _squeeze(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    out = _shape(node)
    keep = [k for k, v in enumerate(src.shape) if True]
    d = _arg(node, 1, "dim")
    S = f"S{L.order[_args(node)[0]]}"
    if d is None:
        keep = [k for k, v in enumerate(src.shape) if v != 1]
    else:
        ds = {x % len(src.shape) for x in (d if isinstance(d, list | tuple) else [d])}
        keep = [k for k, v in enumerate(src.shape) if not (k in ds and v == 1)]
    del out
    return _same_order(L, node, src, "(" + "".join(f"{S}[{k}], " for k in keep) + ")")


def _unsqueeze(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    d = int(_arg(node, 1, "dim")) % (len(src.shape) + 1)
    S = f"S{L.order[_args(node)[0]]}"
    return _same_order(L, node, src, f"{S}[:{d}] + (1,) + {S}[{d}:]")


def _identity(L: Lowering, node: fx.Node) -> Val:
    if node.target in ("to", "type") or node.target is torch.Tensor.to:
        dt = [a for a in (*_args(node)[1:], *_kwargs(node).values()) if isinstance(a, torch.dtype)]
        if dt and dt[0] != torch.float32:
            raise _unsupported(f"conversion to {dt[0]}")
    if node.target in ("long", "int", "double", "half", "bool"):
        raise _unsupported(f"conversion .{node.target}()")
    src = L.tensor(_args(node)[0])
    L.fwd(f"S{L.order[node]} = S{L.order[_args(node)[0]]}")
    return Val(src.shape, src.dims, src.load, f"S{L.order[node]}", src.ctype, src.buffer)


def _permuted(L: Lowering, node: fx.Node, src: Val, perm: list[int]) -> Val:
    n = L.order[node]
    S = f"S{L.order[_args(node)[0]]}"
    L.fwd(f"S{n} = (" + "".join(f"{S}[{k}], " for k in perm) + ")")
    out = _shape(node)
    dims = L.shape_dims(f"S{n}", out)
    inv = [perm.index(k) for k in range(len(perm))]
    nd = len(perm)
    swapped = nd >= 2 and perm == [*range(nd - 2), nd - 1, nd - 2]
    return Val(
        out,
        dims,
        lambda c: src.load([c[inv[k]] for k in range(nd)]),
        f"S{n}",
        src.ctype,
        swapped_last=swapped,
    )


def _permute(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    perm = (
        _args(node)[1:]
        if not isinstance(_args(node)[1] if len(_args(node)) > 1 else None, list | tuple)
        else _args(node)[1]
    )
    if "dims" in _kwargs(node):
        perm = _kwargs(node)["dims"]
    p = [int(d) % len(src.shape) for d in perm]
    return _permuted(L, node, src, p)


def _transpose(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    nd = len(src.shape)
    if node.target in ("t",) or (node.op == "call_function" and node.target in (torch.t, getattr)):
        if node.op == "call_function" and node.target is getattr and _args(node)[1] == "mT":
            a, b = nd - 2, nd - 1
        else:
            a, b = (0, 1) if nd == 2 else (0, 0)
    else:
        a, b = int(_arg(node, 1, "dim0")) % nd, int(_arg(node, 2, "dim1")) % nd
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return _permuted(L, node, src, perm)


def _flip(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    ds = _args(node)[1:] if len(_args(node)) > 2 else _arg(node, 1, "dims")
    ds = [ds] if isinstance(ds, int) else list(ds)
    flips = {int(d) % len(src.shape) for d in ds}
    L.fwd(f"S{L.order[node]} = S{L.order[_args(node)[0]]}")
    dims = src.dims
    return Val(
        src.shape,
        dims,
        lambda c: src.load([f"({dims[k]} - 1 - ({x}))" if k in flips else x for k, x in enumerate(c)]),
        f"S{L.order[node]}",
        src.ctype,
    )


def _expand(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    n = L.order[node]
    out = _shape(node)
    if node.target == "expand_as":
        L.fwd(f"S{n} = S{L.order[_args(node)[1]]}")
    else:
        sizes = _args(node)[1:] if not isinstance(_args(node)[1], list | tuple) else _args(node)[1]
        S = f"S{L.order[_args(node)[0]]}"
        off = len(out) - len(src.shape)
        parts = []
        for k, a in enumerate(sizes):
            parts.append(f"{S}[{k - off}]" if (isinstance(a, int) and a == -1) else _pyexpr(L, a))
        L.fwd(f"S{n} = ({', '.join(parts)},)")
    dims = L.shape_dims(f"S{n}", out)
    return Val(out, dims, lambda c: L.broadcast_load(src, c, out), f"S{n}", src.ctype)


def _fill_like(L: Lowering, node: fx.Node, value: float | None = None) -> Val:
    src = L.tensor(_args(node)[0])
    v = value if value is not None else float(_arg(node, 1, "fill_value"))
    L.fwd(f"S{L.order[node]} = S{L.order[_args(node)[0]]}")
    return Val(src.shape, src.dims, lambda c: lit(v), f"S{L.order[node]}")


def _getitem(L: Lowering, node: fx.Node) -> Val:
    base = _args(node)[0]
    assert isinstance(base, fx.Node)
    if base in L.vals and isinstance(L.vals[base], _Pending):
        return L.vals[base].pick(int(_args(node)[1]))
    src = L.tensor(base)
    idx = _args(node)[1]
    items = list(idx) if isinstance(idx, tuple) else [idx]
    if any(
        isinstance(i, fx.Node)
        or (isinstance(i, slice) and any(isinstance(x, fx.Node) for x in (i.start, i.stop, i.step)))
        for i in items
    ):
        raise _unsupported("indexing by a tensor or a traced size")
    n = L.order[node]
    S = f"S{L.order[base]}"
    L.fwd(f"S{n}, T{n}, U{n} = _norm_index({S}, {idx!r})")
    out = _shape(node)
    dims = L.shape_dims(f"S{n}", out)
    # map output dims to input dims: None adds a dim; an int drops one
    norm = list(items)
    if Ellipsis in norm:
        k = norm.index(Ellipsis)
        fill = len(src.shape) - sum(1 for i in norm if i is not None and i is not Ellipsis)
        norm = norm[:k] + [slice(None)] * fill + norm[k + 1 :]
    norm += [slice(None)] * (len(src.shape) - sum(1 for i in norm if i is not None))
    starts = [L.sym(f"T{n}[{d}]") for d in range(len(src.shape))]
    steps = [L.sym(f"U{n}[{d}]") for d in range(len(src.shape))]

    def load(c: list[str]) -> str:
        cs, od, d = [], 0, 0
        for i in norm:
            if i is None:
                od += 1
                continue
            if isinstance(i, slice):
                cs.append(f"({starts[d]} + ({c[od]}) * {steps[d]})")
                od += 1
            else:
                cs.append(starts[d])
            d += 1
        return src.load(cs)

    return Val(out, dims, load, f"S{n}", src.ctype)


def _select(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    d = int(_arg(node, 1, "dim")) % len(src.shape)
    i = int(_arg(node, 2, "index"))
    n = L.order[node]
    S = f"S{L.order[_args(node)[0]]}"
    L.fwd(f"S{n} = {S}[:{d}] + {S}[{d + 1}:]")
    out = _shape(node)
    dims = L.shape_dims(f"S{n}", out)
    at = L.sym(f"({i} % {S}[{d}])")
    return Val(out, dims, lambda c: src.load([*c[:d], at, *c[d:]]), f"S{n}", src.ctype)


def _narrow(L: Lowering, node: fx.Node) -> Val:
    """``x.narrow(dim, start, length)``: a view; ``start`` and ``length`` may be traced sizes."""
    base = _args(node)[0]
    src = L.tensor(base)
    d = int(_arg(node, 1, "dim")) % len(src.shape)
    start, length = _pyexpr(L, _arg(node, 2, "start")), _pyexpr(L, _arg(node, 3, "length"))
    n = L.order[node]
    S = f"S{L.order[base]}"
    L.fwd(f"S{n} = {S}[:{d}] + (int({length}),) + {S}[{d + 1}:]")
    L.fwd(f"N{n} = int({start}) + ({S}[{d}] if int({start}) < 0 else 0)")
    out = _shape(node)
    dims = L.shape_dims(f"S{n}", out)
    at = L.sym(f"N{n}")
    return Val(out, dims, lambda c: src.load([*c[:d], f"({c[d]} + {at})", *c[d + 1 :]]), f"S{n}", src.ctype)


def _cat(L: Lowering, node: fx.Node) -> Val:
    parts = [L.tensor(a) for a in _arg(node, 0, "tensors")]
    d = int(_arg(node, 1, "dim", 0)) % len(parts[0].shape)
    n = L.order[node]
    names = [f"S{L.order[a]}" for a in _arg(node, 0, "tensors")]
    L.fwd(f"S{n} = {names[0]}[:{d}] + ({' + '.join(f'{s}[{d}]' for s in names)},) + {names[0]}[{d + 1}:]")
    out = _shape(node)
    dims = L.shape_dims(f"S{n}", out)

    def load(c: list[str]) -> str:
        offs = ["0"]
        for p in parts[:-1]:
            offs.append(f"({offs[-1]} + {p.dims[d]})")
        expr = ""
        for k in range(len(parts) - 1, -1, -1):
            e = parts[k].load([*c[:d], f"(({c[d]}) - {offs[k]})", *c[d + 1 :]])
            expr = e if not expr else f"(({c[d]}) < {offs[k + 1]} ? {e} : {expr})"
        return expr

    return Val(out, dims, load, f"S{n}")


def _tri(L: Lowering, node: fx.Node, lower: bool) -> Val:
    src = L.tensor(_args(node)[0])
    k = int(_arg(node, 1, "diagonal", 0))
    L.fwd(f"S{L.order[node]} = S{L.order[_args(node)[0]]}")
    cmp = "<=" if lower else ">="

    def load(c: list[str]) -> str:
        return f"((({c[-1]}) - ({c[-2]})) {cmp} {k} ? {src.load(c)} : 0.0f)"

    return Val(src.shape, src.dims, load, f"S{L.order[node]}")


def _diag(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    if int(_arg(node, 1, "diagonal", 0)) != 0:
        raise _unsupported("torch.diag with an offset")
    n = L.order[node]
    S = f"S{L.order[_args(node)[0]]}"
    out = _shape(node)
    if len(src.shape) == 1:
        L.fwd(f"S{n} = ({S}[0], {S}[0])")
        dims = L.shape_dims(f"S{n}", out)
        return Val(out, dims, lambda c: f"(({c[0]}) == ({c[1]}) ? {src.load([c[0]])} : 0.0f)", f"S{n}")
    L.fwd(f"S{n} = (min({S}[0], {S}[1]),)")
    dims = L.shape_dims(f"S{n}", out)
    return Val(out, dims, lambda c: src.load([c[0], c[0]]), f"S{n}")


_VIEW_OPS: dict[str, Callable[[Lowering, fx.Node], Val]] = {
    "view": _reshape,
    "reshape": _reshape,
    "flatten": _flatten,
    "squeeze": _squeeze,
    "unsqueeze": _unsqueeze,
    "contiguous": _identity,
    "float": _identity,
    "to": _identity,
    "clone": _identity,
    "detach": _identity,
    "long": _identity,
    "int": _identity,
    "half": _identity,
    "double": _identity,
    "bool": _identity,
    "type": _identity,
    "permute": _permute,
    "transpose": _transpose,
    "t": _transpose,
    "T": _transpose,
    "mT": _transpose,
    "flip": _flip,
    "expand": _expand,
    "expand_as": _expand,
    "zeros_like": lambda L, n: _fill_like(L, n, 0.0),
    "ones_like": lambda L, n: _fill_like(L, n, 1.0),
    "full_like": _fill_like,
    "select": _select,
    "narrow": _narrow,
    "cat": _cat,
    "concat": _cat,
    "concatenate": _cat,
    "tril": lambda L, n: _tri(L, n, True),
    "triu": lambda L, n: _tri(L, n, False),
    "diag": _diag,
}


# -- accumulation helpers -----------------------------------------------------------------------


def chunked_sum(
    L: Lowering, acc: str, count: str, term: Callable[[str], str], pre: str = "", lanes: bool = False
) -> str:
    """``float acc`` = the sum of ``term(q)`` for q < count, one partial sum per CHUNK terms; with
    ``lanes`` the 32 lanes of a warp stride the terms (CHUNK terms per lane per partial) and every
    lane ends with the warp's total."""
    return chunked_sums(L, [(acc, term)], count, pre, lanes)


def chunked_sums(
    L: Lowering,
    sums: Sequence[tuple[str, Callable[[str], str]]],
    count: str,
    pre: str = "",
    lanes: bool = False,
) -> str:
    """:func:`chunked_sum` of several ``(acc, term)`` over the same ``q < count`` in ONE loop
    (:func:`.lower_split.fused_sums`): sibling reductions of the same rows read each shared operand once
    (two loops re-read it, from DRAM where the rows in flight overflow L2)."""
    q = L.fresh("q")
    terms = [(acc, term(q)) for acc, term in sums]
    return lower_split.fused_sums(q, count, pre.replace("{q}", q), terms, lanes, CHUNK, UNROLL4)


def extreme_loop(
    L: Lowering, acc: str, count: str, x: Callable[[str], str], cmp: str, lanes: bool = False, init: str = ""
) -> str:
    """``float acc`` = the NaN-propagating max (``cmp`` ``>``) or min (``<``) of ``x(q)`` for q < count
    (``init`` the start value, else -/+INFINITY); with ``lanes`` across a warp, every lane gets it."""
    q = L.fresh("q")
    init = init or ("-INFINITY" if cmp == ">" else "INFINITY")
    head = row_loop(q, count, lanes)
    loop = f"float {acc} = {init}; {head} {{ float v = {x(q)}; {_nan_max(acc, 'v', cmp)} }}"
    return loop + (f" {acc} = kf_w{'max' if cmp == '>' else 'min'}({acc});" if lanes else "")


def row_loop(var: str, count: str, lanes: bool) -> str:
    """The header of a loop over a row's ``count`` elements (lane-strided across a warp with ``lanes``)."""
    if lanes:
        return f"{UNROLL4} for (kf_long {var} = kf_lane; {var} < (kf_long)({count}); {var} += 32)"
    return f"{UNROLL4} for (kf_long {var} = 0; {var} < {count}; ++{var})"


def unrolled_loop(
    L: Lowering,
    count: str,
    x: Callable[[str], str],
    step: Callable[[str, str], str],
    start: str = "0",
    width: int = 8,
    stride: int = 1,
) -> str:
    """A loop over q = ``start``, ``start + stride``, ... below count with ``width`` loads in flight:
    ``x(q)`` the value, ``step(v, q)`` the statement consuming it (in order, so a running result sees the
    terms as the plain loop does). A thread per output walks its column with nothing else to cover the
    loads' latency: eight in flight (four left arg-max/min and prod at 60-70% of the copy rate on the
    H200, session 13's profile)."""
    q = L.fresh("q")
    n = f"(kf_long)({count})"
    loads = " ".join(f"const float {q}v{k} = {x(f'({q} + {k * stride})')};" for k in range(width))
    uses = " ".join(step(f"{q}v{k}", f"({q} + {k * stride})") for k in range(width))
    tail = f"++{q}" if stride == 1 else f"{q} += {stride}"
    return (
        f"kf_long {q} = {start};\n"
        f"        for (; {q} + {(width - 1) * stride} < {n}; {q} += {width * stride}) {{ {loads} {uses} }}\n"
        f"        for (; {q} < {n}; {tail}) {{ const float {q}v0 = {x(q)}; {step(f'{q}v0', q)} }}"
    )


def _nan_max(a: str, x: str, op: str) -> str:
    return f"{a} = ({x} {op} {a} || {x} != {x}) ? {x} : {a};"


def _dims_list(d: Any, nd: int) -> list[int]:
    if d is None:
        return list(range(nd))
    ds = [d] if isinstance(d, int) else list(d)
    return sorted({int(x) % max(nd, 1) for x in ds})


# -- reductions ----------------------------------------------------------------------------------


class _Pending:
    """torch.max/min(x, dim): a pair (values, indices) lowered when one of them is picked."""

    def __init__(self, L: Lowering, node: fx.Node, op: str) -> None:
        self.L, self.node, self.op = L, node, op

    def pick(self, i: int) -> Val:
        op = self.op if i == 0 else f"arg{self.op}"
        dim = _arg(self.node, 1, "dim")
        keep = bool(_arg(self.node, 2, "keepdim", False))
        return reduce(
            self.L, self.node, self.L.tensor(_args(self.node)[0]), op, [int(dim)], keep, pick_node=i
        )


def reduce(
    L: Lowering,
    node: fx.Node,
    src: Val,
    op: str,
    dims: list[int],
    keep: bool,
    pick_node: int | None = None,
    p: float = 2.0,
    correction: float = 1.0,
    divide_by: str = "",
    epilogue: bool = True,
    suffix: str = "",
) -> Val:
    """Reduce ``src`` over ``dims`` with ``op`` (sum mean prod max min argmax argmin norm lse var std)."""
    nd = len(src.shape)
    n = L.order[node]
    tag = (f"{n}_{pick_node}" if pick_node is not None else f"{n}") + suffix
    S = src.py_shape
    L.fwd(f"S{tag} = _rshape({S}, {tuple(dims)!r}, {keep})")
    out = tuple((1 if k in dims else v) for k, v in enumerate(src.shape) if keep or k not in dims)
    rdims = [src.dims[k] for k in dims]
    count = " * ".join(f"(kf_long){d}" for d in rdims) or "1"
    kept = [k for k in range(nd) if k not in dims]

    def in_coords(c: list[str], r: str) -> list[str]:
        return place(c, unflat(r, rdims))

    def place(c: list[str], rc: list[str]) -> list[str]:
        oc = [c[k] for k in range(len(out)) if not (keep and k in dims)] if keep else c
        cs, ki, ri = [], 0, 0
        for k in range(nd):
            if k in dims:
                cs.append(rc[ri])
                ri += 1
            else:
                cs.append(oc[ki])
                ki += 1
        return cs

    del kept

    if pick_node is None and epilogue and keep and not divide_by:  # with its broadcast consumer, one kernel
        fused = lower_scan.fused_rows(L, node, src, op, p, dims, in_coords)
        if fused is not None:
            return fused
    total_r = math.prod(src.shape[k] for k in dims)
    split = op in ("sum", "mean", "max", "min") or (op == "norm" and p in (1.0, 2.0))
    if split and total_r >= SPLIT_MIN and math.prod(out) <= SPLIT_MAX_OUT:
        decl = node if pick_node is None and epilogue else None
        count_py = " * ".join(f"{S}[{k}]" for k in dims) or "1"
        if lower_split.can_split(op, p) and lower_split.column_reduction(L, src, dims, place, out):
            return lower_split.grid_reduce(  # a column reduction of a row-major buffer: a thread per column
                L, decl, src, op, p, tag, out, rdims, (), count_py, "1", place, divide_by, column=True
            )
        if L.fuse and lower_split.can_split(op, p):  # held for a sibling over the same space (one read)
            fold = lower_split.Fold(None, src, op, p, tag, divide_by)
            row_py = f"{S}[{dims[-1]}]"
            return lower_group.defer(L, fold, dims, keep, out, rdims, count_py, row_py, place)
        if L.fuse:  # contiguous runs of a buffer: work-groups of 128-bit loads per piece
            blocked = lower_stats.block_reduce(L, decl, src, op, p, tag, out, dims, divide_by)
            if blocked is not None:
                return blocked
        if lower_split.can_split(op, p):  # work-groups of pieces, then a work-group per output
            rshape = tuple(src.shape[k] for k in dims)
            return lower_split.grid_reduce(
                L, decl, src, op, p, tag, out, rdims, rshape, count_py, f"{S}[{dims[-1]}]", place, divide_by
            )
        return _split_reduce(L, src, op, p, tag, out, count, count_py, in_coords, divide_by, decl)

    def body(c: list[str]) -> str:
        x = lambda q: src.load(in_coords(c, q))  # noqa: E731
        f = lambda name: fn(name, L.lang)  # noqa: E731
        ln = L.lanes(total_r, src.shape, dims)
        if op in ("sum", "mean"):
            s = chunked_sum(L, "acc", count, x, lanes=ln)
            return (
                s
                + (f"\n        acc = acc / (float)({count});" if op == "mean" else "")
                + (f"\n        acc = acc / (float)({divide_by});" if divide_by else "")
            )
        if op in ("var", "std"):
            s = chunked_sum(L, "mu", count, x, lanes=ln) + f"\n        mu = mu / (float)({count});\n        "
            s += chunked_sum(L, "acc", count, lambda q: f"(({x(q)}) - mu) * (({x(q)}) - mu)", lanes=ln)
            s += f"\n        acc = acc / (float)({count} - {lit(correction)});"
            return s + (f"\n        acc = {f('sqrt')}(acc);" if op == "std" else "")
        if op == "norm":
            if p == 2.0:
                return (
                    chunked_sum(L, "acc", count, lambda q: f"(({x(q)}) * ({x(q)}))", lanes=ln)
                    + f"\n        acc = {f('sqrt')}(acc);"
                )
            if p == 1.0:
                return chunked_sum(L, "acc", count, lambda q: f"{f('fabs')}({x(q)})", lanes=ln)
            if math.isinf(p):
                return extreme_loop(L, "acc", count, lambda q: f"{f('fabs')}({x(q)})", ">", ln, "0.0f")
            return (
                chunked_sum(L, "acc", count, lambda q: f"{f('pow')}({f('fabs')}({x(q)}), {lit(p)})", lanes=ln)
                + f"\n        acc = {f('pow')}(acc, {lit(1.0 / p)});"
            )
        if op == "lse":
            if ln:  # a warp per output, eight terms per lane in flight
                return lower_scan.lane_lse(L, count, x, f("exp"), f("log"))
            q = L.fresh("q")
            return lower_split.online_lse(row_loop(q, count, ln), x, q, ln, f("exp"), f("log"))
        if op == "prod":
            q = L.fresh("q")
            if ln:
                return f"float acc = 1.0f; {row_loop(q, count, True)} acc *= {x(q)}; acc = kf_wprod(acc);"
            return "float acc = 1.0f; " + unrolled_loop(L, count, x, lambda v, _: f"acc *= {v};")
        if op in ("max", "min", "argmax", "argmin"):
            q = L.fresh("q")
            cmp = ">" if op.endswith("max") else "<"
            if op.startswith("arg"):
                if ln:  # per lane: the first extreme (or NaN) of its stride, then the warp's first
                    init = "-INFINITY" if cmp == ">" else "INFINITY"
                    return (
                        f"float best = {init}; kf_long acc = KF_NOIDX;\n"
                        f"        {row_loop(q, count, True)} {{ float v = {x(q)}; "
                        f"if (acc == KF_NOIDX || (best == best && (v {cmp} best || v != v))) {{ best = v; acc = {q}; }} }}\n"
                        f"        acc = kf_warg(best, acc, {int(cmp == '>')});"
                    )

                def take(v: str, i: str) -> str:
                    return f"if (best == best && ({v} {cmp} best || {v} != {v})) {{ best = {v}; acc = {i}; }}"

                head = f"float best = {x('0')}; kf_long acc = 0;\n        "
                return head + unrolled_loop(L, count, x, take, "1")
            return extreme_loop(L, "acc", count, x, cmp, ln)
        raise _unsupported(f"reduction {op}")

    ctype = "long" if op.startswith("arg") else "float"
    decl_node = node if pick_node is None and epilogue else None
    return L.emit_pointwise(out, f"S{tag}", body, op, ctype, node=decl_node)


#: Long reductions with few outputs run in two kernels: partial results per SPLIT_PART terms, then their
#: combination (every output gets many work items; the partials are a pairwise level of the sum).
SPLIT_MIN = 8192
SPLIT_MAX_OUT = 16384
SPLIT_PART = 1024


def _split_reduce(
    L: Lowering,
    src: Val,
    op: str,
    p: float,
    tag: str,
    out: tuple[int, ...],
    count: str,
    count_py: str,
    in_coords: Callable[[list[str], str], list[str]],
    divide_by: str,
    node: fx.Node | None,
) -> Val:
    f = lambda name: fn(name, L.lang)  # noqa: E731
    L.fwd(f"R{tag} = (_prod(S{tag}), _cdiv({count_py}, {SPLIT_PART}))")
    total_r = math.prod(src.shape) // max(math.prod(out), 1)
    odims = L.shape_dims(f"S{tag}", out)
    term = {"norm": (lambda v: f"(({v}) * ({v}))") if p == 2.0 else (lambda v: f"{f('fabs')}({v})")}.get(
        op, lambda v: v
    )

    def fold(acc: str, n: str, x: Callable[[str], str], first: bool, terms: int) -> str:
        ln = L.lanes(terms)
        if op in ("max", "min"):
            return extreme_loop(L, acc, n, x, ">" if op == "max" else "<", ln)
        return chunked_sum(L, acc, n, (lambda q: term(x(q))) if first else x, lanes=ln)

    def partial_body(c: list[str]) -> str:
        start = f"(({c[1]}) * {SPLIT_PART})"
        here = f"(({count}) - {start} < {SPLIT_PART} ? ({count}) - {start} : (kf_long){SPLIT_PART})"
        oc = unflat(c[0], odims) if odims else []
        return fold("acc", here, lambda q: src.load(in_coords(oc, f"({start} + {q})")), True, SPLIT_PART)

    parts = L.emit_pointwise(
        (math.prod(out), -(-total_r // SPLIT_PART)), f"R{tag}", partial_body, f"{op}part"
    )
    P = parts.dims[1]

    def final_body(c: list[str]) -> str:
        flat = horner(c, odims) if c else "0"
        s = fold("acc", P, lambda q: parts.load([flat, q]), False, -(-total_r // SPLIT_PART))
        if op == "mean":
            s += f"\n        acc = acc / (float)({count});"
        if op == "norm" and p == 2.0:
            s += f"\n        acc = {f('sqrt')}(acc);"
        return s + (f"\n        acc = acc / (float)({divide_by});" if divide_by else "")

    return L.emit_pointwise(out, f"S{tag}", final_body, op, node=node)


_REDUCE_NAMES = {
    "sum": "sum",
    "mean": "mean",
    "amax": "max",
    "amin": "min",
    "prod": "prod",
    "argmax": "argmax",
    "argmin": "argmin",
    "logsumexp": "lse",
    "norm": "norm",
    "var": "var",
    "std": "std",
    "max": "max",
    "min": "min",
}


def _reduction(L: Lowering, node: fx.Node) -> Val:
    key = str(node.target if node.op == "call_method" else getattr(node.target, "__name__", ""))
    op = _REDUCE_NAMES[key]
    src = L.tensor(_args(node)[0])
    nd = len(src.shape)
    if op in ("max", "min"):
        d = _arg(node, 1, "dim")
        if isinstance(d, fx.Node):
            raise _unsupported("torch.max of two tensors")
        if d is not None and key in ("max", "min"):  # a (values, indices) pair; amax/amin give the values
            pending = _Pending(L, node, op)
            L.vals[node] = pending
            return pending  # type: ignore[return-value]  # a pair: its getitem picks a Val (Lowering.run keeps it)
        if d is None:
            return reduce(L, node, src, op, list(range(nd)), False)
    pos = 2 if op == "norm" else 1
    d = _arg(node, pos, "dim")
    keep = bool(_arg(node, pos + 1, "keepdim", False))
    if op in ("argmax", "argmin") and d is None:
        flat = _same_order(L, _args(node)[0], src, f"(_prod({src.py_shape}),)")
        return reduce(L, node, flat, op, [0], False)
    if op in ("sum", "mean", "prod") and "dtype" in _kwargs(node):
        raise _unsupported("reductions with a dtype")
    if op == "prod" and d is not None:
        return reduce(L, node, src, op, [int(d) % nd], keep)
    pv = _arg(node, 1, "p", 2.0) if op == "norm" else 2.0
    pv = 2.0 if pv in ("fro", None) else float("inf") if pv == "inf" else float(pv)
    corr = 1.0
    if op in ("var", "std"):
        corr = float(_kwargs(node).get("correction", 0 if _kwargs(node).get("unbiased") is False else 1))
    return reduce(L, node, src, op, _dims_list(d, nd), keep, p=pv, correction=corr)


def _normalize(L: Lowering, node: fx.Node) -> Val:
    """F.normalize: x / max(||x||_p over dim, eps), the norm a split-able reduction, the division a loader."""
    src = L.tensor(_args(node)[0])
    p = float(_arg(node, 1, "p", 2.0))
    d = int(_arg(node, 2, "dim", 1)) % len(src.shape)
    eps = float(_arg(node, 3, "eps", 1e-12))
    norm = reduce(L, node, src, "norm", [d], True, p=p, epilogue=False, suffix="norm")
    n = L.order[node]
    L.fwd(f"S{n} = {src.py_shape}")

    def body(c: list[str]) -> str:
        nv = L.broadcast_load(norm, c, src.shape)
        return f"float acc = ({src.load(c)}) / (({nv}) < {lit(eps)} ? {lit(eps)} : ({nv}));"

    return L.emit_pointwise(src.shape, f"S{n}", body, "normalize", node=node)


def _dropout_fn(L: Lowering, node: fx.Node) -> Val:
    p = float(_arg(node, 1, "p", 0.5))
    if p > 0.0 and bool(_arg(node, 2, "training", True)):
        return _dropout_train(L, node, p)
    return _identity(L, node)


def _dropout_train(L: Lowering, node: fx.Node, p: float) -> Val:
    """Dropout in training mode: a fresh random mask per call (a counter hash of the element's flat index
    and a seed that ``forward`` steps each call: ``_kf_seed``), kept elements scaled by 1 / (1 - p).
    Its values differ from torch's mask; a reference whose output does not depend on the mask (a softmax
    over a size-1 dim after it, as KernelBench's Matmul_Dropout_Mean_Softmax) is matched exactly."""
    if p >= 1.0:
        raise _unsupported("dropout with p >= 1")
    src = L.tensor(_args(node)[0])
    n = L.order[node]
    seed = L.sym(f"_kf_seed({n})")
    L.fwd(f"S{n} = {src.py_shape}")
    dims = L.shape_dims(f"S{n}", src.shape)

    def body(c: list[str]) -> str:
        flat = horner(c, dims)
        return f"float acc = kf_keep({flat}, {seed}, {lit(p)}) ? ({src.load(c)}) * {lit(1.0 / (1.0 - p))} : 0.0f;"

    return L.emit_pointwise(src.shape, f"S{n}", body, "dropout", node=node)


def _vector_norm(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    pv = _arg(node, 1, "ord", 2.0)
    d = _arg(node, 2, "dim")
    keep = bool(_arg(node, 3, "keepdim", False))
    return reduce(L, node, src, "norm", _dims_list(d, len(src.shape)), keep, p=float(pv))


# -- rows: softmax, scans, norms -----------------------------------------------------------------


def _softmax(L: Lowering, node: fx.Node, log: bool, src: Val | None = None, dim: int | None = None) -> Val:
    src = src or L.tensor(_args(node)[0])
    d = (dim if dim is not None else int(_arg(node, 1, "dim"))) % len(src.shape)
    if L.fuse and lower_colsoftmax.applies(L, src.shape, d):  # a long strided dim: 32 columns x row slices
        return lower_colsoftmax.column_softmax(L, node, src, d, log)
    n = L.order[node]
    L.fwd(f"S{n} = {src.py_shape}")
    f = lambda name: fn(name, L.lang)  # noqa: E731
    R = src.dims[d]

    def body(c: list[str], store: Callable[[list[str], str], str]) -> str:
        at = lambda q: [*c[:d], q, *c[d + 1 :]]  # noqa: E731
        x = lambda q: src.load(at(q))  # noqa: E731
        ln = L.lanes(src.shape[d], src.shape, [d])
        # the max and the sum in one read (a warp per row: each lane's pair, merged), the row read twice in all
        online = _lane_online_max_sum if ln else _online_max_sum
        s = online(L, R, x, f("exp"))
        w = L.fresh("r")
        # one division per row: each element is multiplied by the sum's reciprocal (within an ulp)
        val = f"(({x(w)}) - mx - {f('log')}(den))" if log else f"({f('exp')}(({x(w)}) - mx) * rden)"
        recip = "" if log else "\n        const float rden = 1.0f / den;"
        return s + f"{recip}\n        {row_loop(w, R, ln)} {store(at(w), val)}"

    return L.emit_rows(src.shape, f"S{n}", [d], body, "logsoftmax" if log else "softmax", node=node)


def _online_step(v: str, exp: str) -> str:
    """One term ``v`` of the running (``mx``, ``den``): the sum rescaled when the max grows, -inf adding
    nothing, a NaN or +inf term making ``den`` NaN, as the two-pass sum's exp(inf - inf) does (torch's row
    of NaNs)."""
    return (
        f"if ({v} > mx || {v} != {v}) {{ den = ({v} != {v} || {v} == INFINITY) ? {v} - {v} : "
        f"den * {exp}(mx - {v}) + 1.0f; mx = {v}; }} else if ({v} != -INFINITY) den += {exp}({v} - mx);"
    )


def _online_max_sum(L: Lowering, count: str, x: Callable[[str], str], exp: str) -> str:
    """``float mx, den``: the max of ``x(q)`` for q < count and the sum of exp(x - mx), in ONE read
    (:func:`_online_step`), eight loads in flight."""
    return "float mx = -INFINITY, den = 0.0f;\n        " + unrolled_loop(
        L, count, x, lambda v, _: _online_step(v, exp)
    )


def _lane_online_max_sum(L: Lowering, count: str, x: Callable[[str], str], exp: str) -> str:
    """:func:`_online_max_sum` across the 32 lanes of a warp (each lane's terms strided by 32), the lanes'
    pairs merged: the warp's max, each sum rescaled to it (a lane of -inf terms adds 0, a NaN max or sum
    spreads), then summed. Every lane ends with the row's ``mx`` and ``den``: the row is read once for
    both, where a max loop and then a sum loop read it twice (from DRAM where the rows in flight
    overflow L2)."""
    q = L.fresh("q")
    return (
        f"float mx = -INFINITY, den = 0.0f;\n        {row_loop(q, count, True)} "
        f"{{ const float v = {x(q)}; {_online_step('v', exp)} }}\n        "
        f"{{ const float mw = kf_wmax(mx); den = mx == -INFINITY ? 0.0f : (mx == mw ? den : den * "
        f"{exp}(mx - mw)); den = kf_wsum(den); mx = mw; }}"
    )


def _softmax_fn(L: Lowering, node: fx.Node) -> Val:
    key = str(node.target if node.op == "call_method" else getattr(node.target, "__name__", ""))
    return _softmax(L, node, key == "log_softmax")


def _scan(L: Lowering, node: fx.Node) -> Val:
    key = str(node.target if node.op == "call_method" else getattr(node.target, "__name__", ""))
    src = L.tensor(_args(node)[0])
    if "dtype" in _kwargs(node) and _kwargs(node)["dtype"] is not None:
        raise _unsupported("scans with a dtype")
    d = int(_arg(node, 1, "dim")) % len(src.shape)
    n = L.order[node]
    L.fwd(f"S{n} = {src.py_shape}")
    R = src.dims[d]
    flip = lower_scan.flipped_user(L, node, d)

    def body(c: list[str], store_fwd: Callable[[list[str], str], str]) -> str:
        def store(cs: list[str], v: str) -> str:  # a flip of the scan is applied on store
            if flip is None:
                return store_fwd(cs, v)
            return store_fwd([*cs[:d], f"({R} - 1 - ({cs[d]}))", *cs[d + 1 :]], v)

        r = L.fresh("r")
        at = [*c[:d], r, *c[d + 1 :]]
        if key != "cummax" and L.lanes(src.shape[d], src.shape, [d]):
            return _warp_scan(
                L,
                key == "cumprod",
                R,
                lambda q: src.load([*c[:d], q, *c[d + 1 :]]),
                lambda q, v: store([*c[:d], q, *c[d + 1 :]], v),
            )
        if key == "cumprod":
            return f"float run = 1.0f; {UNROLL4} for (kf_long {r} = 0; {r} < {R}; ++{r}) {{ run *= {src.load(at)}; {store(at, 'run')} }}"
        if key == "cummax":
            raise _unsupported("cummax")
        # compensated (Kahan) running sum
        return (
            f"float run = 0.0f, comp = 0.0f; {UNROLL4} for (kf_long {r} = 0; {r} < {R}; ++{r}) {{ "
            f"float yv = ({src.load(at)}) - comp; float tv = run + yv; comp = (tv - run) - yv; run = tv; "
            f"{store(at, 'run')} }}"
        )

    if flip is None:
        return L.emit_rows(src.shape, f"S{n}", [d], body, key, node=node)
    # flip(cumsum(., d), d) (a reverse scan): one kernel writes the flipped result; the flip node is that
    # buffer (its epilogue chain applied on store), the scan itself a flipped view of it
    out = L.emit_rows(src.shape, f"S{n}", [d], body, key, node=flip)
    fo = L.order[flip]
    L.fwd(f"S{fo} = S{n}")
    L.vals[flip] = L.buffer_val(str(out.buffer), out.shape, f"S{fo}", out.ctype)
    chain = L.epilogue_chain(flip) if flip in L.applied else []
    for m in chain:
        L.fused_into[m] = flip
    if chain:
        last = chain[-1]
        L.fwd(f"S{L.order[last]} = S{fo}")
        L.vals[last] = L.buffer_val(str(out.buffer), out.shape, f"S{L.order[last]}", out.ctype)
    dims = out.dims
    return Val(
        out.shape,
        dims,
        lambda c: out.load([f"({dims[k]} - 1 - ({x}))" if k == d else x for k, x in enumerate(c)]),
        f"S{n}",
        out.ctype,
    )


def _warp_scan(
    L: Lowering, mul: bool, count: str, x: Callable[[str], str], store: Callable[[str, str], str]
) -> str:
    """A row's inclusive scan across a warp: KF_SU x 32 elements per step (their loads in flight together;
    KF_SU a template parameter, 4 unless the recipe sets it), each 32 scanned by shuffles and added to
    (multiplied into) the carry, a compensated (Kahan) carry for sums. The next step's loads are issued
    before this step's shuffles (software pipelining: a warp's DRAM latency overlaps its own scan, not only
    other warps')."""
    r0, q = L.fresh("r"), L.fresh("q")
    one, scan = ("1.0f", "kf_wscan_mul") if mul else ("0.0f", "kf_wscan_add")
    step = (
        "carry *= kf_wlast(v[u]);"
        if mul
        else "{ const float yv = kf_wlast(v[u]) - comp; const float tv = carry + yv; comp = (tv - carry) - yv; carry = tv; }"
    )
    out = "carry * v[u]" if mul else "carry + v[u]"

    def fetch(into: str, start: str) -> str:
        return (
            f"            #pragma unroll\n"
            f"            for (int u = 0; u < KF_SU; ++u) {{ const kf_long {q} = {start} + 32 * u + kf_lane; "
            f"{into}[u] = {q} < (kf_long)({count}) ? ({x(q)}) : {one}; }}\n"
        )

    return (
        f"float carry = {one}, comp = 0.0f; (void)comp;\n"
        f"        float nv[KF_SU];\n        {{\n{fetch('nv', '(kf_long)0')}        }}\n"
        f"        for (kf_long {r0} = 0; {r0} < (kf_long)({count}); {r0} += 32 * KF_SU) {{\n"
        f"            float v[KF_SU];\n"
        f"            #pragma unroll\n"
        f"            for (int u = 0; u < KF_SU; ++u) v[u] = nv[u];\n"
        f"            if ({r0} + 32 * KF_SU < (kf_long)({count})) {{\n{fetch('nv', f'({r0} + 32 * KF_SU)')}            }}\n"
        f"            #pragma unroll\n"
        f"            for (int u = 0; u < KF_SU; ++u) {{\n"
        f"                const kf_long {q} = {r0} + 32 * u + kf_lane;\n"
        f"                v[u] = {scan}(v[u]);\n"
        f"                if ({q} < (kf_long)({count})) {store(q, out)}\n"
        f"                {step}\n"
        f"            }}\n"
        f"        }}"
    )


def _norm_rows(
    L: Lowering,
    node: fx.Node,
    src: Val,
    row_dims: list[int],
    eps: float,
    weight: str | None,
    bias: str | None,
    chan: Callable[[list[str]], str] | None,
    tag: str,
    mean_var: tuple[str, str] | None = None,
    epilogue: bool = True,
    aff: tuple[Callable[[str], str], str | None] | None = None,
) -> Val:
    """Normalise ``src`` over ``row_dims`` (two passes: mean, then variance of the deviations);
    ``chan(coords)`` indexes the affine parameters, ``aff`` the same for :func:`lower_stats.normalise`
    (the affine index of a row's first element, and the positions per parameter step)."""
    if (
        aff is not None
        and mean_var is None
        and math.prod(src.shape[k] for k in row_dims) >= SPLIT_MIN
        and not (epilogue and L.epilogue_chain(node))
    ):
        # long rows made of runs: split statistics, then a pass over the same pieces
        out = lower_stats.normalise(L, node, src, row_dims, eps, weight, bias, aff, tag)
        if out is not None:
            return out
    n = L.order[node]
    L.fwd(f"S{n} = {src.py_shape}")
    f = lambda name: fn(name, L.lang)  # noqa: E731
    rd = [src.dims[k] for k in row_dims]
    count = " * ".join(f"(kf_long){d}" for d in rd)
    if mean_var is not None or math.prod(src.shape[k] for k in row_dims) >= SPLIT_MIN:
        # long rows (or given statistics): split reductions for the mean and the variance of the
        # deviations, then one work item per element
        fast = lower_stats.row_stats(L, node, src, row_dims) if mean_var is None else None
        if fast is not None:  # one read for both statistics
            mu_v, var_v = fast
            stats = (
                lambda c: L.broadcast_load(mu_v, c, src.shape),
                lambda c: L.broadcast_load(var_v, c, src.shape),
            )
        elif mean_var is None:
            mu = reduce(L, node, src, "mean", row_dims, True, epilogue=False, suffix="mu")
            dev = Val(
                src.shape,
                src.dims,
                lambda c: (
                    f"((({src.load(c)}) - ({L.broadcast_load(mu, c, src.shape)})) * "
                    f"(({src.load(c)}) - ({L.broadcast_load(mu, c, src.shape)})))"
                ),
                src.py_shape,
            )
            var = reduce(L, node, dev, "mean", row_dims, True, epilogue=False, suffix="var")
            stats = (
                lambda c: L.broadcast_load(mu, c, src.shape),
                lambda c: L.broadcast_load(var, c, src.shape),
            )
        else:
            stats = (lambda c: mean_var[0], lambda c: mean_var[1])

        def point(c: list[str]) -> str:
            val = f"((({src.load(c)}) - ({stats[0](c)})) * {f('rsqrt')}(({stats[1](c)}) + {lit(eps)}))"
            if weight is not None and chan is not None:
                val = f"({val} * {weight}[{chan(c)}])"
            if bias is not None and chan is not None:
                val = f"({val} + {bias}[{chan(c)}])"
            return f"float acc = {val};"

        return L.emit_pointwise(src.shape, f"S{n}", point, tag, node=node if epilogue else None)

    def body(c: list[str], store: Callable[[list[str], str], str]) -> str:
        def at(q: str) -> list[str]:
            rc = unflat(q, rd)
            cs = list(c)
            for k, x in zip(row_dims, rc, strict=True):
                cs[k] = x
            return cs

        x = lambda q: src.load(at(q))  # noqa: E731
        ln = L.lanes(math.prod(src.shape[k] for k in row_dims), src.shape, row_dims)
        if mean_var is None:
            s = chunked_sum(L, "mu", count, x, lanes=ln) + f"\n        mu = mu / (float)({count});\n        "
            s += chunked_sum(L, "var", count, lambda q: f"(({x(q)}) - mu) * (({x(q)}) - mu)", lanes=ln)
            s += f"\n        var = var / (float)({count});\n        "
        else:
            s = f"float mu = {mean_var[0]}; float var = {mean_var[1]};\n        "
        s += f"const float rstd = {f('rsqrt')}(var + {lit(eps)});\n        "
        w = L.fresh("r")
        cs = at(w)
        val = f"((({x(w)}) - mu) * rstd)"
        if weight is not None and chan is not None:
            val = f"({val} * {weight}[{chan(cs)}])"
        if bias is not None and chan is not None:
            val = f"({val} + {bias}[{chan(cs)}])"
        return s + f"{row_loop(w, count, ln)} {{ {store(cs, val)} }}"

    return L.emit_rows(src.shape, f"S{n}", row_dims, body, tag, node=node if epilogue else None)


def _batch_norm(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    src = L.tensor(_args(node)[0])
    nd = len(src.shape)
    w = L.ptr(f"{path}.weight") if getattr(mod, "weight", None) is not None else None
    b = L.ptr(f"{path}.bias") if getattr(mod, "bias", None) is not None else None
    chan = lambda c: c[1]  # noqa: E731
    if isinstance(mod, nn.modules.batchnorm._BatchNorm):
        if mod.training or mod.running_mean is None:
            return _norm_rows(
                L, node, src, [0, *range(2, nd)], mod.eps, w, b, chan, "batchnorm", aff=(lambda r: r, None)
            )
        rm, rv = L.ptr(f"{path}.running_mean"), L.ptr(f"{path}.running_var")
        return _norm_rows(
            L,
            node,
            src,
            [0, *range(2, nd)],
            mod.eps,
            w,
            b,
            chan,
            "batchnorm_eval",
            mean_var=(f"{rm}[c1]", f"{rv}[c1]"),
        )
    if isinstance(mod, nn.modules.instancenorm._InstanceNorm):
        if mod.track_running_stats and not mod.training:
            raise _unsupported("instance norm with running statistics")
        inst = (lambda r: f"(({r}) % {src.dims[1]})", None)
        return _norm_rows(L, node, src, list(range(2, nd)), mod.eps, w, b, chan, "instancenorm", aff=inst)
    raise _unsupported(type(mod).__name__)


def _group_norm(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    assert isinstance(mod, nn.GroupNorm)
    w = L.ptr(f"{path}.weight") if mod.affine else None
    b = L.ptr(f"{path}.bias") if mod.affine else None
    return _group_norm_rows(L, node, f"{path}.num_groups", mod.num_groups, mod.eps, w, b)


def _param_ptr(L: Lowering, a: Any) -> str | None:
    """The kernel pointer of a functional norm's weight or bias (a parameter of the reference), or None."""
    if a is None:
        return None
    if isinstance(a, fx.Node) and a.op == "get_attr":
        return L.ptr(ref_path(str(a.target)))
    raise _unsupported("a normalisation weight that is not a parameter of the model")


def _group_norm_fn(L: Lowering, node: fx.Node) -> Val:
    groups = int(_pyval(L, _arg(node, 1, "num_groups")))
    w, b = _param_ptr(L, _arg(node, 2, "weight")), _param_ptr(L, _arg(node, 3, "bias"))
    return _group_norm_rows(L, node, str(groups), groups, float(_arg(node, 4, "eps", 1e-5)), w, b)


def _instance_norm_fn(L: Lowering, node: fx.Node) -> Val:
    if _arg(node, 1, "running_mean") is not None or not bool(_arg(node, 5, "use_input_stats", True)):
        raise _unsupported("instance norm with running statistics")
    src = L.tensor(_args(node)[0])
    w, b = _param_ptr(L, _arg(node, 3, "weight")), _param_ptr(L, _arg(node, 4, "bias"))
    chan = lambda c: c[1]  # noqa: E731
    eps = float(_arg(node, 7, "eps", 1e-5))
    inst = (lambda r: f"(({r}) % {src.dims[1]})", None)
    return _norm_rows(L, node, src, list(range(2, len(src.shape))), eps, w, b, chan, "instancenorm", aff=inst)


def _layer_norm_fn(L: Lowering, node: fx.Node) -> Val:
    src = L.tensor(_args(node)[0])
    shape = _pyval(L, _arg(node, 1, "normalized_shape"))
    k = 1 if isinstance(shape, int) else len(tuple(shape))
    nd = len(src.shape)
    w, b = _param_ptr(L, _arg(node, 2, "weight")), _param_ptr(L, _arg(node, 3, "bias"))
    rd = list(range(nd - k, nd))
    chan = lambda c: horner([c[i] for i in rd], [src.dims[i] for i in rd])  # noqa: E731
    eps = float(_arg(node, 4, "eps", 1e-5))
    return _norm_rows(L, node, src, rd, eps, w, b, chan, "layernorm", aff=(lambda r: "0", "1"))


def _group_norm_rows(
    L: Lowering, node: fx.Node, groups_py: str, groups: int, eps: float, w: str | None, b: str | None
) -> Val:
    """Group norm with ``groups_py`` (Python text) groups: rows of the (N, G, C/G * spatial) view."""
    src = L.tensor(_args(node)[0])
    n = L.order[node]
    nd = len(src.shape)
    G = L.sym(groups_py)
    # view x as (N, G, C/G * spatial): rows (n, g); stats over the last dim
    S = src.py_shape
    L.fwd(f"V{n} = ({S}[0], {groups_py}, _prod({S}[1:]) // {groups_py})")
    vshape = (src.shape[0], groups, math.prod(src.shape[1:]) // groups)
    vd = L.shape_dims(f"V{n}", vshape)
    flat_dims = src.dims
    if src.buffer is not None:  # the same flat order: index the buffer directly
        view = L.buffer_val(src.buffer, vshape, f"V{n}", src.ctype)
    else:
        view = Val(vshape, vd, lambda c: src.load(unflat(horner(c, vd), flat_dims)), f"V{n}")
    # 32-bit division: the position in a row and the spatial size are below the row length, an int argument
    spatial = " * ".join(f"(unsigned){d}" for d in src.dims[2:]) or "1u"
    cpg = f"({src.dims[1]} / {G})"
    chan = lambda c: f"(({c[1]}) * {cpg} + (kf_long)((unsigned)({c[2]}) / ({spatial})))"  # noqa: E731
    del nd
    # the rows kernel writes the (N, G, rest) view; its buffer's flat order is the input's
    aff = (lambda r: f"((({r}) % {G}) * {cpg})", spatial)
    v = _norm_rows(L, node, view, [2], eps, w, b, chan, "groupnorm", epilogue=False, aff=aff)
    L.fwd(f"S{n} = {S}")
    return L.buffer_val(str(v.buffer), src.shape, f"S{n}")


def _layer_norm_mod(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    assert isinstance(mod, nn.LayerNorm)
    src = L.tensor(_args(node)[0])
    k = len(mod.normalized_shape)
    nd = len(src.shape)
    w = L.ptr(f"{path}.weight") if mod.elementwise_affine and mod.weight is not None else None
    b = L.ptr(f"{path}.bias") if mod.elementwise_affine and mod.bias is not None else None
    rd = list(range(nd - k, nd))
    chan = lambda c: horner([c[i] for i in rd], [src.dims[i] for i in rd])  # noqa: E731
    return _norm_rows(L, node, src, rd, mod.eps, w, b, chan, "layernorm", aff=(lambda r: "0", "1"))


# -- matmul family -------------------------------------------------------------------------------


def _matmul(L: Lowering, node: fx.Node) -> Val:
    a, b = L.tensor(_args(node)[0]), L.tensor(_args(node)[1])
    key = str(node.target if node.op == "call_method" else getattr(node.target, "__name__", ""))
    if key in ("mm",) and (len(a.shape) != 2 or len(b.shape) != 2):
        raise _unsupported("torch.mm of non-matrices")
    n = L.order[node]
    L.fwd(f"S{n} = _mmshape({a.py_shape}, {b.py_shape})")
    out = _shape(node)
    a1, b1 = len(a.shape) == 1, len(b.shape) == 1
    ashape = (1, *a.shape) if a1 else a.shape
    bshape = (*b.shape, 1) if b1 else b.shape
    K = a.dims[-1]
    full = (*_broadcast(ashape[:-2], bshape[:-2]), ashape[-2], bshape[-1])

    if L.fuse and not (a1 or b1) and ashape[-2] >= 2 and bshape[-1] >= 2:
        nb = len(full) - 2
        bdims = L.shape_dims(f"S{n}", out)[:nb]
        M, N = a.dims[-2], b.dims[-1]
        S = f"S{n}"
        return L.emit_tiled_mm(
            out,
            S,
            bdims,
            (M, N, K),
            (f"{S}[-1]", f"{S}[-2]", f"_prod({S}[:-2])"),
            lambda bc, i, k: a.load([*_bc_coords(bc, full[:-2], ashape[:-2]), i, k]),
            lambda bc, k, j: b.load([*_bc_coords(bc, full[:-2], bshape[:-2]), k, j]),
            lambda bc, i, j: [*bc, i, j],
            "lintile" if b.swapped_last and not b1 else "mmtile",  # B read along K where its rows run so
            node,
        )

    def body(c: list[str]) -> str:
        cs = list(c)
        if a1:
            cs = [*cs[:-1], "0", cs[-1]] if not b1 else ["0", "0"]
        if b1 and not a1:
            cs = [*cs, "0"]
        batch, i, j = cs[:-2], cs[-2], cs[-1]

        def aload(q: str) -> str:
            bc = _bc_coords(batch, full[:-2], ashape[:-2])
            return a.load([q] if a1 else [*bc, i, q])

        def bload(q: str) -> str:
            bc = _bc_coords(batch, full[:-2], bshape[:-2])
            return b.load([q] if b1 else [*bc, q, j])

        ln = L.lanes(a.shape[-1]) if math.prod(out) <= (1 << 16) else False
        return chunked_sum(L, "acc", K, lambda q: f"({aload(q)}) * ({bload(q)})", lanes=ln)

    return L.emit_pointwise(out, f"S{n}", body, "matmul", node=node)


def _einsum(L: Lowering, node: fx.Node) -> Val:
    """torch.einsum without ellipsis: one work item per output element, a chunked sum over the
    contracted letters (any number of operands; a letter repeated in one operand takes its diagonal)."""
    args = _args(node)
    eq = str(args[0]).replace(" ", "")
    nodes = list(args[1]) if len(args) == 2 and isinstance(args[1], list | tuple) else args[1:]
    if "." in eq:
        raise _unsupported("einsum with an ellipsis")
    ins, _, outs = eq.partition("->")
    terms = ins.split(",")
    if not _:
        outs = "".join(sorted(ch for ch in set(ins.replace(",", "")) if ins.count(ch) == 1))
    vals = [L.tensor(a) for a in nodes]
    if len(terms) != len(vals) or any(len(t) != len(v.shape) for t, v in zip(terms, vals, strict=True)):
        raise _unsupported(f"einsum {eq!r} with these operands")
    where: dict[str, tuple[int, int]] = {}
    for i, t in enumerate(terms):
        for d, ch in enumerate(t):
            where.setdefault(ch, (i, d))
    n = L.order[node]
    L.fwd(f"S{n} = (" + "".join(f"{vals[where[ch][0]].py_shape}[{where[ch][1]}], " for ch in outs) + ")")
    out = _shape(node)
    contracted = [ch for ch in where if ch not in outs]
    csizes = [vals[where[ch][0]].dims[where[ch][1]] for ch in contracted]
    count = " * ".join(f"(kf_long){d}" for d in csizes) or "1"

    def body(c: list[str]) -> str:
        def term(q: str) -> str:
            at = dict(zip(outs, c, strict=True))
            at.update(zip(contracted, unflat(q, csizes) if csizes else [], strict=True))
            return " * ".join(f"({v.load([at[ch] for ch in t])})" for t, v in zip(terms, vals, strict=True))

        return chunked_sum(L, "acc", count, term)

    return L.emit_pointwise(out, f"S{n}", body, "einsum", node=node)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(torch.Size(a), torch.Size(b)))


def _bc_coords(coords: list[str], full: tuple[int, ...], mine: tuple[int, ...]) -> list[str]:
    off = len(full) - len(mine)
    return ["0" if mine[k] == 1 and full[k + off] != 1 else coords[k + off] for k in range(len(mine))]


def _linear_common(L: Lowering, node: fx.Node, x: Val, w: Val, bias: Val | None, py_out: str) -> Val:
    n = L.order[node]
    L.fwd(f"S{n} = {x.py_shape}[:-1] + ({py_out},)")
    out = _shape(node)
    K = x.dims[-1]
    if L.fuse and math.prod(out[:-1]) >= 2 and out[-1] >= 2:
        S = f"S{n}"
        direct = lower_mm_direct.linear(L, node, x, w, bias, out, S)
        if direct is not None:
            return direct
        lead = x.dims[:-1]
        M = " * ".join(f"(kf_long){d}" for d in lead) or "1"
        return L.emit_tiled_mm(
            out,
            S,
            [],
            (M, w.dims[0], K),
            (f"{S}[-1]", f"_prod({S}[:-1])", "1"),
            lambda bc, i, k: x.load([*unflat(i, lead), k]),
            lambda bc, k, j: w.load([j, k]),
            lambda bc, i, j: [*unflat(i, lead), j],
            "lintile",
            node,
            bias=(lambda j: bias.load([j])) if bias is not None else None,
        )

    def body(c: list[str]) -> str:
        s = chunked_sum(L, "acc", K, lambda q: f"({x.load([*c[:-1], q])}) * ({w.load([c[-1], q])})")
        return s + (f"\n        acc += {bias.load([c[-1]])};" if bias is not None else "")

    return L.emit_pointwise(out, f"S{n}", body, "linear", node=node)


def _linear_mod(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    assert isinstance(mod, nn.Linear)
    x = L.tensor(_args(node)[0])
    w = L.buffer_val(f"{path}.weight", tuple(mod.weight.shape), f"tuple({path}.weight.shape)")
    b = (
        L.buffer_val(f"{path}.bias", tuple(mod.bias.shape), f"tuple({path}.bias.shape)")
        if mod.bias is not None
        else None
    )
    return _linear_common(L, node, x, w, b, f"{path}.weight.shape[0]")


def _linear_fn(L: Lowering, node: fx.Node) -> Val:
    x, w = L.tensor(_args(node)[0]), L.tensor(_args(node)[1])
    bn = _arg(node, 2, "bias")
    b = L.tensor(bn) if bn is not None else None
    return _linear_common(L, node, x, w, b, f"{w.py_shape}[0]")


# -- convolution and pooling ---------------------------------------------------------------------


def _conv(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    assert isinstance(mod, nn.modules.conv._ConvNd)
    if isinstance(mod.padding, str) or mod.padding_mode != "zeros":
        raise _unsupported("convolution with string or non-zero padding modes")
    x = L.tensor(_args(node)[0])
    nd = len(mod.kernel_size)
    if len(x.shape) != nd + 2:
        raise _unsupported("unbatched convolution")
    transposed = bool(mod.transposed)
    n = L.order[node]
    if transposed:
        L.fwd(
            f"S{n} = _convtshape({x.py_shape}, tuple({path}.weight.shape), {path}.groups, {path}.stride, "
            f"{path}.padding, {path}.dilation, {path}.output_padding)"
        )
    else:
        L.fwd(
            f"S{n} = _convshape({x.py_shape}, tuple({path}.weight.shape), {path}.stride, {path}.padding, "
            f"{path}.dilation)"
        )
    out = _shape(node)
    w = L.buffer_val(f"{path}.weight", tuple(mod.weight.shape), f"tuple({path}.weight.shape)")
    bias = L.ptr(f"{path}.bias") if mod.bias is not None else None
    st = [L.sym(f"{path}.stride[{k}]") for k in range(nd)]
    pd = [L.sym(f"{path}.padding[{k}]") for k in range(nd)]
    dl = [L.sym(f"{path}.dilation[{k}]") for k in range(nd)]
    G = L.sym(f"{path}.groups")
    ks = w.dims[2:]
    odims = L.shape_dims(f"S{n}", out)
    rows = int(mod.weight.shape[1]) if transposed else int(mod.weight.shape[0]) // int(mod.groups)
    phases = math.prod(mod.stride) if transposed else 1
    z = int(x.shape[0]) * int(mod.groups) * phases  # the GEMM's grid z: at most 65535
    dw = lower_conv.depthwise_static(mod) if nd == 2 and not transposed else None
    depthwise = int(mod.weight.shape[1]) == 1 and int(mod.groups) == int(x.shape[1])
    if L.fuse and dw is not None and depthwise and int(out[0]) * int(out[1]) <= 65535:  # a stencil
        return lower_conv.emit_conv_depthwise(L, node, x, w, bias, (st, pd, dl, G), dw, out, f"S{n}")
    if L.fuse and rows >= lower_conv.MIN_ROWS and z <= 65535:  # an implicit GEMM
        return lower_conv.emit_conv_gemm(
            L,
            node,
            x,
            w,
            bias,
            transposed,
            (st, pd, dl, G),
            out,
            f"S{n}",
            f"{path}.groups",
            int(mod.groups),
            [f"{path}.stride[{k}]" for k in range(nd)],
        )

    def body(c: list[str]) -> str:
        nn_, co, oc = c[0], c[1], c[2:]
        ci = L.fresh("ci")
        loops, kc = _window(L, ks)
        if not transposed:
            cin_g = w.dims[1]
            cout_g = f"({odims[1]} / {G})"
            pos = [f"(({oc[k]}) * {st[k]} - {pd[k]} + ({kc[k]}) * {dl[k]})" for k in range(nd)]
            inside = " && ".join(f"{p} >= 0 && {p} < {x.dims[2 + k]}" for k, p in enumerate(pos))
            chan = f"(({co}) / {cout_g}) * {cin_g} + {ci}"
            wl = w.load([co, ci, *kc])
        else:
            cin_g = f"({x.dims[1]} / {G})"
            cout_g = w.dims[1]
            t = [f"(({oc[k]}) + {pd[k]} - ({kc[k]}) * {dl[k]})" for k in range(nd)]
            pos = [f"({tk} / {st[k]})" for k, tk in enumerate(t)]
            inside = " && ".join(
                f"{tk} >= 0 && {tk} % {st[k]} == 0 && {p} < {x.dims[2 + k]}"
                for k, (tk, p) in enumerate(zip(t, pos, strict=True))
            )
            chan = f"(({co}) / {cout_g}) * {cin_g} + {ci}"
            wl = w.load([chan, f"(({co}) % {cout_g})", *kc])
        xl = x.load([nn_, chan, *pos])
        part = L.fresh("part")
        s = (
            f"float acc = 0.0f;\n        for (kf_long {ci} = 0; {ci} < {cin_g}; ++{ci}) {{\n"
            f"            float {part} = 0.0f;\n"
            f"            {loops} {{ if ({inside}) {part} += ({xl}) * ({wl}); }}\n"
            f"            acc += {part};\n        }}"
        )
        return s + (f"\n        acc += {bias}[{co}];" if bias else "")

    return L.emit_pointwise(out, f"S{n}", body, "convT" if transposed else "conv", node=node)


def _window(L: Lowering, sizes: list[str]) -> tuple[str, list[str]]:
    """Nested loop headers over a window of ``sizes`` (int counters, no index division) and their names."""
    names = [L.fresh("w") for _ in sizes]
    return " ".join(f"for (int {w} = 0; {w} < {k}; ++{w})" for w, k in zip(names, sizes, strict=True)), names


# pooling: lower_pool (imported here, after the helpers it uses from this module)
from kfoundry.plugins.llms.offline import lower_pool  # noqa: E402

_pool_mod = lower_pool.pool_mod
_pool_fn = lower_pool.pool_fn
_adaptive_avg = lower_pool.adaptive_avg


# -- losses and attention --------------------------------------------------------------------------


def _finish_loss(L: Lowering, node: fx.Node, per: Val, reduction: str) -> Val:
    if reduction == "none":
        return per
    every = list(range(len(per.shape)))
    if reduction == "batchmean":
        return reduce(L, node, per, "sum", every, False, divide_by=L.sym(f"{per.py_shape}[0]"))
    return reduce(L, node, per, "mean" if reduction == "mean" else "sum", every, False)


def _loss_kw(L: Lowering, node: fx.Node) -> dict[str, Any]:
    """A loss call's keyword arguments (a loss module's own settings where the node is a module call)."""
    return {**_kwargs(node), **L.module_kwargs.get(node, {})}


def _loss_mod(
    fn_: Callable[[Lowering, fx.Node], Val], *names: str
) -> Callable[[Lowering, fx.Node, nn.Module, str], Val]:
    """A handler for a loss module: its attributes ``names`` as the functional form's keyword arguments."""

    def handler(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
        if getattr(mod, "weight", None) is not None:
            raise _unsupported(f"{type(mod).__name__} with class weights")
        L.module_kwargs[node] = {k: getattr(mod, k) for k in names if hasattr(mod, k)}
        return fn_(L, node)

    return handler


def _pointwise_loss(L: Lowering, node: fx.Node, expr: Callable[[str, str], str]) -> Val:
    a, b = L.tensor(_args(node)[0]), L.tensor(_args(node)[1])
    out = tuple(torch.broadcast_shapes(torch.Size(a.shape), torch.Size(b.shape)))
    n = L.order[node]
    L.fwd(f"E{n} = _bshape({a.py_shape}, {b.py_shape})")
    dims = L.shape_dims(f"E{n}", out)
    per = Val(out, dims, lambda c: expr(L.broadcast_load(a, c, out), L.broadcast_load(b, c, out)), f"E{n}")
    if str(_loss_kw(L, node).get("reduction", "mean")) == "none":
        return L.emit_pointwise(out, f"E{n}", lambda c: f"float acc = {per.load(c)};", "loss", node=node)
    return _finish_loss(L, node, per, str(_loss_kw(L, node).get("reduction", "mean")))


def _mse(L: Lowering, node: fx.Node) -> Val:
    return _pointwise_loss(L, node, lambda a, b: f"((({a}) - ({b})) * (({a}) - ({b})))")


def _l1(L: Lowering, node: fx.Node) -> Val:
    return _pointwise_loss(L, node, lambda a, b: f"{fn('fabs', L.lang)}(({a}) - ({b}))")


def _smooth_l1(L: Lowering, node: fx.Node) -> Val:
    beta = float(_loss_kw(L, node).get("beta", 1.0))
    f = lambda name: fn(name, L.lang)  # noqa: E731
    if beta == 0.0:
        return _l1(L, node)
    return _pointwise_loss(
        L,
        node,
        lambda a, b: (
            f"({f('fabs')}(({a}) - ({b})) < {lit(beta)} ? 0.5f * (({a}) - ({b})) * (({a}) - ({b})) / {lit(beta)} : "
            f"{f('fabs')}(({a}) - ({b})) - {lit(0.5 * beta)})"
        ),
    )


def _huber(L: Lowering, node: fx.Node) -> Val:
    delta = float(_loss_kw(L, node).get("delta", 1.0))
    f = lambda name: fn(name, L.lang)  # noqa: E731
    return _pointwise_loss(
        L,
        node,
        lambda a, b: (
            f"({f('fabs')}(({a}) - ({b})) < {lit(delta)} ? 0.5f * (({a}) - ({b})) * (({a}) - ({b})) : "
            f"{lit(delta)} * ({f('fabs')}(({a}) - ({b})) - {lit(0.5 * delta)}))"
        ),
    )


def _kl_div(L: Lowering, node: fx.Node) -> Val:
    if _loss_kw(L, node).get("log_target"):
        return _pointwise_loss(L, node, lambda a, b: f"({fn('exp', L.lang)}({b}) * (({b}) - ({a})))")
    log = fn("log", L.lang)

    def term(a: str, b: str) -> str:
        inner = _log_operand(a, log)
        if inner is None:
            return f"(({b}) > 0.0f ? ({b}) * ({log}({b}) - ({a})) : (({b}) == 0.0f ? 0.0f : NAN))"
        # kl_div(log(p), t): t * log(t / p), one logarithm instead of two, where t / p is a normal float
        # (else, and for p <= 0, inf or NaN, log t - log p as torch computes it)
        r = f"(({b}) / ({inner}))"
        return (
            f"(({b}) > 0.0f ? ({b}) * (({r} >= 1.17549435e-38f && {r} <= 3.40282347e38f) ? {log}({r}) : "
            f"({log}({b}) - {log}({inner}))) : (({b}) == 0.0f ? 0.0f : NAN))"
        )

    return _pointwise_loss(L, node, term)


def _log_operand(a: str, log: str) -> str | None:
    """``X`` where the C expression ``a`` is ``log(X)`` as a whole (``_kl_div``), else None."""
    a = a.strip()
    while a.startswith("(") and a.endswith(")") and _closes_at_end(a, 0):
        a = a[1:-1].strip()
    if not (a.startswith(f"{log}(") and a.endswith(")")) or not _closes_at_end(a, len(log)):
        return None
    return a[len(log) + 1 : -1]


def _closes_at_end(a: str, i: int) -> bool:
    """Whether the parenthesis at ``a[i]`` closes at the end of ``a``."""
    depth = 0
    for k in range(i, len(a)):
        depth += {"(": 1, ")": -1}.get(a[k], 0)
        if depth == 0:
            return k == len(a) - 1
    return False


def _cross_entropy(L: Lowering, node: fx.Node) -> Val:
    x, t = L.tensor(_args(node)[0]), L.tensor(_args(node)[1])
    if (
        t.ctype != "long"
        or len(x.shape) != 2
        or _loss_kw(L, node).get("weight") is not None
        or float(_loss_kw(L, node).get("label_smoothing", 0.0)) != 0.0
    ):
        raise _unsupported("cross-entropy other than (N, C) logits with integer targets")
    n = L.order[node]
    L.fwd(f"S{n}_per = ({x.py_shape}[0],)")
    f = lambda name: fn(name, L.lang)  # noqa: E731
    C = x.dims[1]
    ign = int(_loss_kw(L, node).get("ignore_index", -100))

    def body(c: list[str]) -> str:
        xl = lambda q: x.load([c[0], q])  # noqa: E731
        ln = L.lanes(x.shape[1])
        if ln:
            s = extreme_loop(L, "mx", C, xl, ">", True) + "\n        "
        else:
            r = L.fresh("r")
            s = (
                f"float mx = -INFINITY; for (kf_long {r} = 0; {r} < {C}; ++{r}) "
                f"{{ float v = {xl(r)}; {_nan_max('mx', 'v', '>')} }}\n        "
            )
        s += chunked_sum(L, "den", C, lambda q: f"{f('exp')}(({xl(q)}) - mx)", lanes=ln)
        tl = t.load([c[0]])
        return s + (
            f"\n        const kf_long tg = {tl};\n"
            f"        float acc = tg == {ign} ? 0.0f : mx + {f('log')}(den) - ({xl('tg')});"
        )

    per = _xent_rows(L, node, x, t, ign)
    if per is None:
        per = L.emit_pointwise((x.shape[0],), f"S{n}_per", body, "xent")
    if str(_loss_kw(L, node).get("reduction", "mean")) == "mean" and x.buffer is not None and L.fuse:
        # the count of targets not ignored as a split reduction (was one warp over every target)
        ok = Val(t.shape, t.dims, lambda c: f"({t.load(c)} == {ign} ? 0.0f : 1.0f)", t.py_shape)
        cnt = reduce(L, node, ok, "sum", [0], False, epilogue=False, suffix="cnt")
        tot = reduce(L, node, per, "sum", [0], False, epilogue=False)
        return L.emit_pointwise(
            (), f"S{n}", lambda c: f"float acc = {tot.load([])} / {cnt.load([])};", "xentmean", node=node
        )
    if str(_loss_kw(L, node).get("reduction", "mean")) == "mean":  # torch: the mean over targets not ignored
        cnt = L.emit_pointwise(
            (),
            "()",
            lambda c: chunked_sum(
                L,
                "acc",
                t.dims[0],
                lambda q: f"({t.load([q])} == {ign} ? 0.0f : 1.0f)",
                lanes=L.lanes(t.shape[0]),
            ),
            "xentcount",
        )
        tot = reduce(L, node, per, "sum", [0], False, epilogue=False)
        return L.emit_pointwise(
            (), f"S{n}", lambda c: f"float acc = {tot.load([])} / {cnt.load([])};", "xentmean", node=node
        )
    reduction = str(_loss_kw(L, node).get("reduction", "mean"))
    return _finish_loss(L, node, per, reduction)


def _xent_rows(L: Lowering, node: fx.Node, x: Val, t: Val, ign: int) -> Val | None:
    """Cross-entropy's per-row terms, a work-group per row reading it once (float4 loads, four in flight
    per work item): a running max and a sum of exponentials rescaled when the max grows (by exactly 1 when
    it does not move, -inf terms adding 0, NaN propagating: the two-pass kernel's results), merged
    across the work-group. None where the logits are not a buffer (the caller's path)."""
    if x.buffer is None or not L.fuse:
        return None
    f = lambda name: fn(name, L.lang)  # noqa: E731
    n = L.order[node]
    L.fwd(f"X{n} = int({x.py_shape}[1] % 4 == 0 and {x.buffer}.data_ptr() % 16 == 0)")
    C, vec = x.dims[1], L.sym(f"X{n}")
    xp = L.ptr(x.buffer)
    mx = lambda a, b: f"{a} = ({b} > {a} || {b} != {b}) ? {b} : {a};"  # noqa: E731
    term = lambda v: f"({v} == -INFINITY ? 0.0f : {f('exp')}({v} - mm))"  # noqa: E731
    resc = "(m == mm ? 1.0f : {e}(m - mm))".format(e=f("exp"))
    ld4 = "vload4(i, p)" if L.lang == "opencl" else "reinterpret_cast<const float4*>(p)[i]"
    ninf4 = (
        "(float4)(-INFINITY, -INFINITY, -INFINITY, -INFINITY)"
        if L.lang == "opencl"
        else "make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY)"
    )
    comps = [f"v[u].{c}" for c in "xyzw"]
    text = f"""    KF_LOCAL float kf_m[BLOCK];
    KF_LOCAL float kf_s[BLOCK];
    const int t = KF_LID(0);
    const kf_long row = KF_GRP(0);
    KF_G const float* p = {xp} + row * (kf_long){C};
    float m = -INFINITY, s = 0.0f;
    if ({vec}) {{
        const int c4 = (int)({C} >> 2);
        for (int i0 = t; i0 < c4; i0 += 4 * BLOCK) {{
            float4 v[4];
            #pragma unroll
            for (int u = 0; u < 4; ++u) {{ const int i = i0 + u * BLOCK; v[u] = i < c4 ? {ld4} : {ninf4}; }}
            float mm = m;
            #pragma unroll
            for (int u = 0; u < 4; ++u) {{ {" ".join(mx("mm", c) for c in comps)} }}
            float add = 0.0f;
            #pragma unroll
            for (int u = 0; u < 4; ++u) add += ({" + ".join(term(c) for c in comps)});
            s = s * {resc} + add;
            m = mm;
        }}
    }} else {{
        for (int i = t; i < {C}; i += BLOCK) {{
            const float xv = p[i];
            float mm = m; {mx("mm", "xv")}
            s = s * {resc} + {term("xv")};
            m = mm;
        }}
    }}
    kf_m[t] = m;
    kf_s[t] = s;
    KF_BARRIER;
    for (int o = BLOCK / 2; o > 0; o >>= 1) {{
        if (t < o) {{
            const float ma = kf_m[t], mb = kf_m[t + o];
            float mm = ma; {mx("mm", "mb")}
            kf_s[t] = kf_s[t] * (ma == mm ? 1.0f : {f("exp")}(ma - mm)) + kf_s[t + o] * (mb == mm ? 1.0f : {f("exp")}(mb - mm));
            kf_m[t] = mm;
        }}
        KF_BARRIER;
    }}
    if (t == 0) {{
        const kf_long tg = {t.load(["row"])};
        y[row] = tg == {ign} ? 0.0f : kf_m[0] + {f("log")}(kf_s[0]) - p[tg];
    }}"""
    L.fwd(f"S{n}_per = ({x.py_shape}[0],)")
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty(S{n}_per, dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, S{n}_per[0]), 1, 1), block=(p['BLOCK'], 1, 1)"
    name = L.kernel(text, "float", "", "xent", launch_dims=launch)
    L.fwd(L.sched.kernels[-1].launch)
    return L.buffer_val(name, (x.shape[0],), f"S{n}_per")


def _triplet(
    L: Lowering, node: fx.Node, margin: float, p: float, eps: float, swap: bool, reduction: str
) -> Val:
    """max(d(a, p) - d(a, n) + margin, 0) with d the p-norm of the difference plus eps (pairwise_distance)."""
    if swap or p != 2.0:
        raise _unsupported("triplet margin loss with swap or p != 2")
    a, pos, neg = (L.tensor(x) for x in _args(node)[:3])
    if len(a.shape) != 2 or a.shape != pos.shape or a.shape != neg.shape:
        raise _unsupported("triplet margin loss other than three (N, D) inputs")
    n = L.order[node]
    L.fwd(f"S{n}_per = ({a.py_shape}[0],)")
    f = lambda name: fn(name, L.lang)  # noqa: E731
    D = a.dims[1]
    e = lit(eps)

    def body(c: list[str]) -> str:
        dp = lambda q: f"(({a.load([c[0], q])}) - ({pos.load([c[0], q])}) + {e})"  # noqa: E731
        dn = lambda q: f"(({a.load([c[0], q])}) - ({neg.load([c[0], q])}) + {e})"  # noqa: E731
        ln = L.lanes(a.shape[1])
        # both distances in one pass over the anchor (two passes read it twice from DRAM)
        terms = [("sp", lambda q: f"{dp(q)} * {dp(q)}"), ("sn", lambda q: f"{dn(q)} * {dn(q)}")]
        s = chunked_sums(L, terms, D, lanes=ln) + "\n        "
        v = f"{f('sqrt')}(sp) - {f('sqrt')}(sn) + {lit(margin)}"
        return s + f"float acc = ({v}) < 0.0f ? 0.0f : ({v});"

    per = L.emit_pointwise((a.shape[0],), f"S{n}_per", body, "triplet")
    return _finish_loss(L, node, per, reduction)


def _triplet_fn(L: Lowering, node: fx.Node) -> Val:
    kw = _loss_kw(L, node)
    return _triplet(
        L,
        node,
        float(_arg(node, 3, "margin", 1.0)),
        float(_arg(node, 4, "p", 2.0)),
        float(_arg(node, 5, "eps", 1e-6)),
        bool(_arg(node, 6, "swap", False)),
        str(kw.get("reduction", "mean")),
    )


def _triplet_mod(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    assert isinstance(mod, nn.TripletMarginLoss)
    return _triplet(
        L, node, float(mod.margin), float(mod.p), float(mod.eps), bool(mod.swap), str(mod.reduction)
    )


def _cosine(L: Lowering, node: fx.Node) -> Val:
    a, b = L.tensor(_args(node)[0]), L.tensor(_args(node)[1])
    full = tuple(torch.broadcast_shapes(torch.Size(a.shape), torch.Size(b.shape)))
    d = int(_arg(node, 2, "dim", 1)) % len(full)
    eps = float(_arg(node, 3, "eps", 1e-8))
    n = L.order[node]
    L.fwd(f"E{n} = _bshape({a.py_shape}, {b.py_shape})")
    L.fwd(f"S{n} = E{n}[:{d}] + E{n}[{d + 1}:]")
    out = _shape(node)
    fd = L.shape_dims(f"E{n}", full)
    f = lambda name: fn(name, L.lang)  # noqa: E731

    def body(c: list[str]) -> str:
        at = lambda q: [*c[:d], q, *c[d:]]  # noqa: E731
        al = lambda q: L.broadcast_load(a, at(q), full)  # noqa: E731
        bl = lambda q: L.broadcast_load(b, at(q), full)  # noqa: E731
        ln = L.lanes(full[d], full, [d])
        q = L.fresh("q")  # one loop: a and b read once for the three sums
        pre = f"const float va = {al(q)}, vb = {bl(q)};"
        sums = [("dot", "va * vb"), ("na", "va * va"), ("nb", "vb * vb")]
        s = lower_split.fused_sums(q, fd[d], pre, sums, ln, CHUNK, UNROLL4) + "\n        "
        e = lit(eps)
        return s + (
            f"float acc = dot / ({f('fmax')}({f('sqrt')}(na), {e}) * {f('fmax')}({f('sqrt')}(nb), {e}));"
        )

    return L.emit_pointwise(out, f"S{n}", body, "cosine", node=node)


def _sdpa(L: Lowering, node: fx.Node) -> Val:
    q, k, v = (L.tensor(a) for a in _args(node)[:3])
    if (
        _arg(node, 3, "attn_mask") is not None
        or float(_arg(node, 4, "dropout_p", 0.0)) != 0.0
        or _kwargs(node).get("enable_gqa")
    ):
        raise _unsupported("attention with a mask, dropout or grouped heads")
    causal = bool(_arg(node, 5, "is_causal", False))
    scale = _arg(node, 6, "scale")
    n = L.order[node]
    qs, ks, vs = q.py_shape, k.py_shape, v.py_shape
    L.fwd(f"S{n} = _bshape({qs}[:-2], {ks}[:-2], {vs}[:-2]) + ({qs}[-2], {vs}[-1])")
    out = _shape(node)
    E = q.dims[-1]
    Skv = k.dims[-2]
    sc = lit(float(scale)) if scale is not None else f"(1.0f / {fn('sqrt', L.lang)}((float){E}))"
    f = lambda name: fn(name, L.lang)  # noqa: E731
    if L.fuse and len(out) >= 2 and min(q.shape[-2], k.shape[-2], v.shape[-1]) >= 2:
        # scores, softmax rows and P @ V through the tiled products (lower_attention)
        from kfoundry.plugins.llms.offline.lower_attention import sdpa_by_matmuls

        return sdpa_by_matmuls(L, node, q, k, v, causal, sc)

    def body(c: list[str]) -> str:
        batch, i, dv = c[:-2], c[-2], c[-1]
        kb = _bc_coords(batch, out[:-2], k.shape[:-2])
        vb = _bc_coords(batch, out[:-2], v.shape[:-2])
        qb = _bc_coords(batch, out[:-2], q.shape[:-2])
        j = L.fresh("j")
        end = f"(({i}) + 1 < {Skv} ? ({i}) + 1 : {Skv})" if causal else Skv
        score = chunked_sum(L, "s", E, lambda e: f"({q.load([*qb, i, e])}) * ({k.load([*kb, j, e])})")
        return (
            f"float m = -INFINITY, l = 0.0f, acc = 0.0f;\n"
            f"        for (kf_long {j} = 0; {j} < {end}; ++{j}) {{\n        {score}\n"
            f"            s = s * {sc};\n"
            f"            const float mn = {f('fmax')}(m, s);\n"
            f"            const float corr = m == mn ? 1.0f : {f('exp')}(m - mn);\n"
            f"            const float pj = s == -INFINITY ? 0.0f : {f('exp')}(s - mn);\n"
            f"            l = l * corr + pj; acc = acc * corr + pj * ({v.load([*vb, j, dv])}); m = mn;\n"
            f"        }}\n        acc = m == -INFINITY ? 0.0f : acc / l;  /* a row with no finite score: 0, as torch */"
        )

    if not L.fuse:
        return L.emit_pointwise(out, f"S{n}", body, "sdpa", node=node)
    Dv = v.dims[-1]

    def rows(c: list[str], store: Callable[[list[str], str], str]) -> str:
        # one work item per query row: each score computed once, SDPA_CHUNK output columns per pass
        batch, i = c[:-2], c[-2]
        kb = _bc_coords(batch, out[:-2], k.shape[:-2])
        vb = _bc_coords(batch, out[:-2], v.shape[:-2])
        qb = _bc_coords(batch, out[:-2], q.shape[:-2])
        j, t = L.fresh("j"), L.fresh("t")
        end = f"(({i}) + 1 < {Skv} ? ({i}) + 1 : {Skv})" if causal else Skv
        score = chunked_sum(L, "s", E, lambda e: f"({q.load([*qb, i, e])}) * ({k.load([*kb, j, e])})")
        C = SDPA_CHUNK
        vload = v.load([*vb, j, f"d0 + {t}"])
        final = store([*c[:-1], f"d0 + {t}"], f"(m == -INFINITY ? 0.0f : o[{t}] / l)")
        return (
            f"for (kf_long d0 = 0; d0 < {Dv}; d0 += {C}) {{\n"
            f"        const int nd = {Dv} - d0 < {C} ? (int)({Dv} - d0) : {C};\n"
            f"        float o[{C}];\n        for (int {t} = 0; {t} < {C}; ++{t}) o[{t}] = 0.0f;\n"
            f"        float m = -INFINITY, l = 0.0f;\n"
            f"        for (kf_long {j} = 0; {j} < {end}; ++{j}) {{\n        {score}\n"
            f"            s = s * {sc};\n"
            f"            const float mn = {f('fmax')}(m, s);\n"
            f"            const float corr = m == mn ? 1.0f : {f('exp')}(m - mn);\n"
            f"            const float pj = s == -INFINITY ? 0.0f : {f('exp')}(s - mn);\n"
            f"            l = l * corr + pj; m = mn;\n"
            f"            for (int {t} = 0; {t} < nd; ++{t}) o[{t}] = o[{t}] * corr + pj * ({vload});\n"
            f"        }}\n"
            f"        for (int {t} = 0; {t} < nd; ++{t}) {final}\n    }}"
        )

    return L.emit_rows(out, f"S{n}", [len(out) - 1], rows, "sdpa_rows", node=node)


#: Output columns of one SDPA pass (a private accumulator per column).
SDPA_CHUNK = 64


def _max_pair(L: Lowering, node: fx.Node) -> Val:
    return _reduction(L, node)


_ANCHOR_OPS: dict[str, Callable[[Lowering, fx.Node], Val]] = {
    **{k: _reduction for k in _REDUCE_NAMES},
    "vector_norm": _vector_norm,
    "normalize": _normalize,
    "dropout": _dropout_fn,
    "group_norm": _group_norm_fn,
    "instance_norm": _instance_norm_fn,
    "layer_norm": _layer_norm_fn,
    "softmax": _softmax_fn,
    "log_softmax": _softmax_fn,
    "cumsum": _scan,
    "cumprod": _scan,
    "matmul": _matmul,
    "einsum": _einsum,
    "mm": _matmul,
    "bmm": _matmul,
    "linear": _linear_fn,
    "max_pool1d": _pool_fn,
    "max_pool2d": _pool_fn,
    "max_pool3d": _pool_fn,
    "avg_pool1d": _pool_fn,
    "avg_pool2d": _pool_fn,
    "avg_pool3d": _pool_fn,
    "adaptive_avg_pool1d": lambda L, n: _adaptive_avg(L, n, _arg(n, 1, "output_size"), 1),
    "adaptive_avg_pool2d": lambda L, n: _adaptive_avg(L, n, _arg(n, 1, "output_size"), 2),
    "adaptive_avg_pool3d": lambda L, n: _adaptive_avg(L, n, _arg(n, 1, "output_size"), 3),
    "mse_loss": _mse,
    "l1_loss": _l1,
    "smooth_l1_loss": _smooth_l1,
    "huber_loss": _huber,
    "kl_div": _kl_div,
    "cross_entropy": _cross_entropy,
    "cosine_similarity": _cosine,
    "triplet_margin_loss": _triplet_fn,
    "scaled_dot_product_attention": _sdpa,
}


def _softmax_mod(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    d = getattr(mod, "dim", None)
    if d is None:
        raise _unsupported("nn.Softmax without dim")
    return _softmax(L, node, isinstance(mod, nn.LogSoftmax), dim=int(d))


def _flatten_mod(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    assert isinstance(mod, nn.Flatten)
    return _flatten(L, node, mod.start_dim, mod.end_dim)


def _dropout_mod(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    if mod.training and float(getattr(mod, "p", 0.0)) > 0.0:
        return _dropout_train(L, node, float(getattr(mod, "p", 0.5)))
    return _identity(L, node)


def _adaptive_mod(L: Lowering, node: fx.Node, mod: nn.Module, path: str) -> Val:
    name = type(mod).__name__
    if not name.startswith("AdaptiveAvg"):
        raise _unsupported(name)
    return _adaptive_avg(L, node, mod.output_size, int(name[-2]))


_MODULE_OPS: dict[str, Callable[[Lowering, fx.Node, nn.Module, str], Val]] = {
    "Linear": _linear_mod,
    **{f"Conv{d}d": _conv for d in (1, 2, 3)},
    **{f"ConvTranspose{d}d": _conv for d in (1, 2, 3)},
    **{f"MaxPool{d}d": _pool_mod for d in (1, 2, 3)},
    **{f"AvgPool{d}d": _pool_mod for d in (1, 2, 3)},
    **{f"AdaptiveAvgPool{d}d": _adaptive_mod for d in (1, 2, 3)},
    **{f"BatchNorm{d}d": _batch_norm for d in (1, 2, 3)},
    **{f"InstanceNorm{d}d": _batch_norm for d in (1, 2, 3)},
    "TripletMarginLoss": _triplet_mod,
    "MSELoss": _loss_mod(_mse, "reduction"),
    "L1Loss": _loss_mod(_l1, "reduction"),
    "SmoothL1Loss": _loss_mod(_smooth_l1, "reduction", "beta"),
    "HuberLoss": _loss_mod(_huber, "reduction", "delta"),
    "KLDivLoss": _loss_mod(_kl_div, "reduction", "log_target"),
    "CrossEntropyLoss": _loss_mod(_cross_entropy, "reduction", "ignore_index", "label_smoothing"),
    "GroupNorm": _group_norm,
    "LayerNorm": _layer_norm_mod,
    "Softmax": _softmax_mod,
    "LogSoftmax": _softmax_mod,
    "Flatten": _flatten_mod,
    "Dropout": _dropout_mod,
    "Identity": lambda L, n, m, p: _identity(L, n),
}

__all__ = ["lower_node", "py_value", "reduce", "F"]
