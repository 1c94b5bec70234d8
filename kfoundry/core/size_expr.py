"""Size expressions of native task files: shapes, scalar values, launch sizes and restrictions.

Python expressions over the sizes and template parameters, with ``ceil_div``, ``min``, ``max`` and
``math.*``; evaluated by walking the AST (no ``eval``), bounded in magnitude and length, and every
error names the expression and where it was written.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from kfoundry.core.errors import ProblemError

Expr = int | float | str


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


_FUNCTIONS: dict[str, Any] = {"ceil_div": ceil_div, "min": min, "max": max}
_MATH = {"ceil", "floor", "sqrt", "log2", "log", "exp", "gcd", "lcm", "isqrt", "prod"}
_BINARY: dict[type[ast.operator], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
_COMPARE: dict[type[ast.cmpop], Any] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
#: Sizes are bounded: no value past 2**96 (far beyond any memory), no expression longer than this.
_MAX_MAGNITUDE = 2**96
_MAX_EXPR_CHARS = 2000


class _Refused(Exception):
    """An expression outside the size-expression language."""


def _bounded(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and not abs(value) <= _MAX_MAGNITUDE:
        raise _Refused("value out of range")
    if not isinstance(value, int | float):
        raise _Refused(f"a {type(value).__name__} value")
    return value


def _eval_node(node: ast.AST, names: dict[str, Any]) -> Any:
    """Arithmetic over numbers and ``names`` (bounded: exponents and shifts stay small)."""
    if isinstance(node, ast.Expression):
        return _eval_node(node.body, names)
    if isinstance(node, ast.Constant):
        return _bounded(node.value)
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise _Refused(f"unknown name {node.id!r}")
        return _bounded(names[node.id])
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left, names), _eval_node(node.right, names)
        if isinstance(node.op, ast.Pow | ast.LShift) and abs(right) > 128:
            raise _Refused("exponent or shift larger than 128")
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp):
        value = _eval_node(node.operand, names)
        ops: dict[type[ast.unaryop], Any] = {
            ast.USub: operator.neg,
            ast.UAdd: operator.pos,
            ast.Not: operator.not_,
            ast.Invert: operator.invert,
        }
        return _bounded(ops[type(node.op)](value))
    if isinstance(node, ast.BoolOp):
        values = [_eval_node(v, names) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left, ok = _eval_node(node.left, names), True
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval_node(right_node, names)
            ok, left = ok and _COMPARE[type(op)](left, right), right
        return ok
    if isinstance(node, ast.IfExp):
        return _eval_node(node.body if _eval_node(node.test, names) else node.orelse, names)
    if isinstance(node, ast.Call) and not node.keywords:
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in _FUNCTIONS:
            func = _FUNCTIONS[fn.id]
        elif (
            isinstance(fn, ast.Attribute)
            and isinstance(fn.value, ast.Name)
            and fn.value.id == "math"
            and fn.attr in _MATH
        ):
            func = getattr(math, fn.attr)
        else:
            raise _Refused("a call other than ceil_div, min, max or math functions")
        return _bounded(func(*[_eval_node(a, names) for a in node.args]))
    raise _Refused(f"{type(node).__name__} is not allowed")


def evaluate(expr: Expr | None, names: dict[str, Any], what: str) -> Any:
    """Evaluate a size expression over ``names`` (arithmetic, comparisons, ``ceil_div``, ``min``,
    ``max``, ``math.*``; bounded time and size); errors name the expression."""
    if not isinstance(expr, str):
        return expr
    if len(expr) > _MAX_EXPR_CHARS:
        raise ProblemError(f"{what}: expression longer than {_MAX_EXPR_CHARS} characters")
    shown = expr if len(expr) <= 80 else expr[:77] + "..."
    try:
        return _eval_node(ast.parse(expr.strip(), mode="eval"), names)
    except _Refused as exc:
        raise ProblemError(f"{what}: cannot evaluate {shown!r}: {exc}") from None
    except (
        SyntaxError,
        ValueError,
        TypeError,
        ArithmeticError,
        RecursionError,
        MemoryError,
        KeyError,
    ) as exc:
        raise ProblemError(f"{what}: cannot evaluate {shown!r}: {type(exc).__name__}: {exc}"[:300]) from None
