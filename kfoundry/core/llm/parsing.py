"""Turn a model's reply into kernel source: a full code block, or SEARCH/REPLACE diffs on the parent.

Diffs are applied exactly when they match, else line by line ignoring indentation, runs of spaces
and blank lines (the failure weaker models hit most). Every failure is a :class:`ParseFailure`
whose one-line message is shown to the model in the next prompt.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Literal

from kfoundry.core.models import ParamValue, TunableSpace

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.#-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.DOTALL | re.MULTILINE)
_DIFF = re.compile(
    r"^[ \t]*<{5,}[ \t]*SEARCH[ \t]*\n(.*?)^[ \t]*={5,}[ \t]*\n(.*?)^[ \t]*>{5,}[ \t]*REPLACE[ \t]*$",
    re.DOTALL | re.MULTILINE,
)
_KERNEL_LANGS = {"c", "cpp", "c++", "cl", "opencl", "cuda", "cu", "hip", "sycl", ""}


class ParseFailure(Exception):
    """The reply held no usable code; the message says why in one line."""


@dataclass
class ParsedReply:
    """What a reply yielded."""

    source: str
    via: Literal["block", "diff"]
    rationale: str = ""
    params: dict[str, ParamValue] = field(default_factory=dict)
    space: TunableSpace | None = None
    diffs_applied: int = 0


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Fenced code blocks as (language tag, body), in order."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def diff_blocks(text: str) -> list[tuple[str, str]]:
    """SEARCH/REPLACE blocks as (search, replace), in order."""
    return [(m.group(1), m.group(2)) for m in _DIFF.finditer(text)]


def _norm(line: str) -> str:
    return " ".join(line.split())


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def apply_diff(source: str, search: str, replace: str) -> str:
    """Replace the one place in ``source`` that ``search`` matches, tolerant of whitespace differences.

    A SEARCH text that matches nowhere, or in more than one place, is a :class:`ParseFailure`.
    """
    if not search.strip():
        raise ParseFailure("a SEARCH block is empty")
    exact = source.count(search)
    if exact == 1:
        return source.replace(search, replace, 1)
    src_lines = source.split("\n")
    want = [_norm(x) for x in search.split("\n") if x.strip()]
    body = [(i, _norm(x)) for i, x in enumerate(src_lines) if x.strip()]
    starts = [
        s
        for s in range(len(body) - len(want) + 1)
        if all(body[s + k][1] == want[k] for k in range(len(want)))
    ]
    head = want[0][:60]
    if len(starts) > 1 or exact > 1:
        raise ParseFailure(
            f"SEARCH block matches {max(len(starts), exact)} places (first line: {head!r}); quote more lines"
        )
    if not starts:
        raise ParseFailure(f"SEARCH block not found in the parent (first line: {head!r})")
    first, last = body[starts[0]][0], body[starts[0] + len(want) - 1][0]
    return "\n".join(src_lines[:first] + _reindent(search, replace, src_lines[first]) + src_lines[last + 1 :])


def _reindent(search: str, replace: str, matched_first: str) -> list[str]:
    """Shift the replacement by the indentation difference between the SEARCH text and the parent."""
    search_first = next(x for x in search.split("\n") if x.strip())
    have, had = _indent(matched_first), _indent(search_first)
    lines = replace.rstrip("\n").split("\n") if replace.strip() else []
    if have == had:
        return lines
    if len(have) > len(had):
        extra = have[len(had) :]
        return [extra + x if x.strip() else x for x in lines]
    cut = len(had) - len(have)
    return [x[cut:] if x[:cut].strip() == "" else x.lstrip() for x in lines]


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def _scalar(v: object) -> bool:
    return isinstance(v, int | float | str | bool)


def extract_params(source: str) -> dict[str, ParamValue]:
    """Template parameter values a Python candidate declares: the defaults of its
    ``PARAMS.get("NAME", default)`` reads, and any literal ``PARAMS = {...}`` dict."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    params: dict[str, ParamValue] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "PARAMS"
            and len(node.args) == 2
        ):
            name, default = _literal(node.args[0]), _literal(node.args[1])
            if isinstance(name, str) and _scalar(default):
                params.setdefault(name, default)  # type: ignore[arg-type]
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PARAMS" for t in node.targets
        ):
            expr = node.value
            if isinstance(expr, ast.Dict) and expr.keys and expr.keys[0] is None:  # {**{...}, **harness}
                expr = expr.values[0]
            value = _literal(expr)
            if isinstance(value, dict) and all(isinstance(k, str) and _scalar(v) for k, v in value.items()):
                params.update(value)
    return params


def extract_space(source: str) -> TunableSpace | None:
    """The ``TUNABLE = {"NAME": [values...]}`` (and ``RESTRICTIONS = [...]``) a candidate declares."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id in ("TUNABLE", "TUNABLES", "RESTRICTIONS"):
                    found[t.id] = _literal(node.value)
    table = found.get("TUNABLE", found.get("TUNABLES"))
    if not isinstance(table, dict) or not table:
        return None
    params = {
        k: list(v)
        for k, v in table.items()
        if isinstance(k, str) and isinstance(v, list | tuple) and v and all(_scalar(x) for x in v)
    }
    restrictions = found.get("RESTRICTIONS")
    rules = [r for r in restrictions if isinstance(r, str)] if isinstance(restrictions, list | tuple) else []
    return TunableSpace(params=params, restrictions=rules) if params else None


_PARAMS_LITERAL = re.compile(r"^PARAMS\s*=\s*(\{[^\n]*\})[ \t]*$", re.MULTILINE)


def harness_params(source: str) -> str:
    """Let the harness's ``PARAMS`` win over a literal ``PARAMS = {...}`` line (so tuning takes effect)."""
    return _PARAMS_LITERAL.sub(r'PARAMS = {**\1, **globals().get("PARAMS", {})}', source, count=1)


def _rationale(text: str) -> str:
    stripped = _DIFF.sub("", _FENCE.sub("", text))
    return " ".join(stripped.split())[:600]


def _check_python(source: str) -> None:
    try:
        compile(source, "<candidate>", "exec")
    except SyntaxError as exc:
        raise ParseFailure(f"the code does not parse as Python: {exc.msg} at line {exc.lineno}") from None
    if "class ModelNew" not in source:
        raise ParseFailure("the code defines no `class ModelNew`")


def parse_reply(
    text: object, kind: Literal["kernelbench", "native"], parent_source: str | None = None
) -> ParsedReply:
    """Parse a reply into source; raises :class:`ParseFailure` with a one-line reason."""
    if not isinstance(text, str) or not text.strip():
        raise ParseFailure("the reply was empty")
    diffs = diff_blocks(text)
    if diffs:
        if parent_source is None:
            raise ParseFailure(
                "the reply holds SEARCH/REPLACE diffs but there is no parent kernel to apply them to"
            )
        source = parent_source
        for i, (search, replace) in enumerate(diffs, 1):
            try:
                source = apply_diff(source, search, replace)
            except ParseFailure as exc:
                raise ParseFailure(f"diff {i} of {len(diffs)}: {exc}") from None
        if kind == "kernelbench":
            source = harness_params(source)
            _check_python(source)
            return ParsedReply(
                source, "diff", _rationale(text), extract_params(source), extract_space(source), len(diffs)
            )
        return ParsedReply(source, "diff", _rationale(text), diffs_applied=len(diffs))
    blocks = code_blocks(text)
    if not blocks:
        if text.count("```") % 2 == 1:
            raise ParseFailure("the reply ends inside an unclosed code block (truncated? allow more tokens)")
        raise ParseFailure("the reply holds no fenced code block and no SEARCH/REPLACE diff")
    if kind == "kernelbench":
        chosen = [body for _, body in blocks if "class ModelNew" in body]
        if not chosen:
            raise ParseFailure("no code block defines `class ModelNew`")
        source = harness_params(chosen[-1].rstrip() + "\n")
        _check_python(source)
        return ParsedReply(source, "block", _rationale(text), extract_params(source), extract_space(source))
    chosen = [body for lang, body in blocks if lang in _KERNEL_LANGS] or [b for _, b in blocks]
    return ParsedReply(max(chosen, key=len).rstrip() + "\n", "block", _rationale(text))
