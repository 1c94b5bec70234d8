"""The cookbook's C elementwise expressions (``spec.expr("cuda")``) as Triton expressions.

A small precedence-climbing parser over the C subset :mod:`.elementwise_ops` writes (literals, names,
calls, unary ``-``/``!``, arithmetic, comparisons, ``&&``/``||``, ``?:``), printed back as Triton:
``c ? a : b`` is ``tl.where(c, a, b)``, ``expf`` is ``tl.exp``, ``1.0f`` is ``1.0``. Anything else
raises :class:`~kfoundry.core.generator.GeneratorUnsupported` (the recipe is not offered).
"""

from __future__ import annotations

import re

from kfoundry.core.generator import GeneratorUnsupported

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?f?)|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>&&|\|\||==|!=|<=|>=|[-+*/<>?:(),!]))"
)

#: C function -> Triton expression template over the arguments ``{0}``, ``{1}``.
_FUNCTIONS = {
    "exp": "tl.exp({0})",
    "log": "tl.log({0})",
    "sqrt": "tl.sqrt({0})",
    "rsqrt": "tl.rsqrt({0})",
    "fabs": "tl.abs({0})",
    "sin": "tl.sin({0})",
    "cos": "tl.cos({0})",
    "erf": "tl.erf({0})",
    "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})",
    "exp2": "tl.exp2({0})",
    "log2": "tl.log2({0})",
    "tanh": "(2.0 * tl.sigmoid(2.0 * ({0})) - 1.0)",
    "expm1": "(tl.exp({0}) - 1.0)",
    "kf_expm1": "(tl.exp({0}) - 1.0)",
    "kf_mish": "tl.where(({0}) > 20.0, ({0}), ({0}) * (1.0 - 2.0 / (tl.exp({0}) * (tl.exp({0}) + 2.0) + 2.0)))",
    "log1p": "tl.log(1.0 + ({0}))",
    "kf_softplus": "(tl.maximum({0}, 0.0) + tl.log(1.0 + tl.exp(-tl.abs({0}))))",
    "log10": "(tl.log({0}) * 0.4342944819032518)",
    "tan": "(tl.sin({0}) / tl.cos({0}))",
    "fmax": "tl.maximum({0}, {1})",
    "fmin": "tl.minimum({0}, {1})",
    "pow": "tl.exp2(tl.log2({0}) * ({1}))",
    "fma": "tl.fma({0}, {1}, {2})",
}
_BINARY = [("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/")]
_PY = {"||": "|", "&&": "&"}


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise GeneratorUnsupported(f"offline generator: no Triton form for {expr[pos : pos + 20]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, expr: str) -> None:
        self.toks = _tokens(expr)
        self.i = 0

    def peek(self) -> str:
        return self.toks[self.i][1] if self.i < len(self.toks) else ""

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks) or (want is not None and self.toks[self.i][1] != want):
            raise GeneratorUnsupported(
                f"offline generator: expected {want or 'more'} in an elementwise expression"
            )
        self.i += 1
        return self.toks[self.i - 1]

    def ternary(self) -> str:
        cond = self.binary(0)
        if self.peek() != "?":
            return cond
        self.take("?")
        a = self.ternary()
        self.take(":")
        b = self.ternary()
        return f"tl.where({cond}, {a}, {b})"

    def binary(self, level: int) -> str:
        if level == len(_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in _BINARY[level]:
            op = self.take()[1]
            right = self.binary(level + 1)
            left = f"({left} {_PY.get(op, op)} {right})"
        return left

    def unary(self) -> str:
        if self.peek() == "-":
            self.take()
            return f"(-{self.unary()})"
        if self.peek() == "!":
            self.take()
            return f"(~{self.unary()})"
        return self.atom()

    def atom(self) -> str:
        kind, text = self.take()
        if text == "(":
            inner = self.ternary()
            self.take(")")
            return f"({inner})"
        if kind == "num":
            value = text.rstrip("f")
            return value if any(c in value for c in ".eE") else f"{value}.0" if text.endswith("f") else value
        if kind != "name":
            raise GeneratorUnsupported(f"offline generator: unexpected {text!r} in an elementwise expression")
        if text == "INFINITY":
            return 'float("inf")'
        if self.peek() != "(":
            if not re.fullmatch(r"v\d+|v|x", text):
                raise GeneratorUnsupported(
                    f"offline generator: unknown name {text!r} in an elementwise expression"
                )
            return text
        self.take("(")
        args = [self.ternary()]
        while self.peek() == ",":
            self.take(",")
            args.append(self.ternary())
        self.take(")")
        base = text[:-1] if text.endswith("f") and text[:-1] in _FUNCTIONS else text
        base = "rsqrt" if text == "rsqrtf" else base
        if base not in _FUNCTIONS:
            raise GeneratorUnsupported(f"offline generator: no Triton form of {text}()")
        return _FUNCTIONS[base].format(*args)


def triton_expr(c_expr: str) -> str:
    """The Triton form of a cookbook C expression (raises GeneratorUnsupported outside the subset)."""
    parser = _Parser(c_expr)
    out = parser.ternary()
    if parser.i != len(parser.toks):
        raise GeneratorUnsupported(
            f"offline generator: trailing {parser.peek()!r} in an elementwise expression"
        )
    return out
