"""Turn a model's reply into kernel source: a full code block, or SEARCH/REPLACE diffs on the parent.

Diffs are applied exactly when they match, else line by line ignoring indentation, runs of spaces
and blank lines (the failure weaker models hit most). Every failure is a :class:`ParseFailure`
whose one-line message is shown to the model in the next prompt.
"""

from __future__ import annotations

import ast
import bisect
import re
from dataclasses import dataclass, field
from typing import Literal

from kfoundry.core.languages import fence_names
from kfoundry.core.models import ParamValue, TunableSpace

#: Replies longer than this (characters) or holding more diffs are refused: parsing stays bounded.
MAX_REPLY_CHARS = 1_000_000
MAX_DIFFS = 200

# One line each: matched with ``fullmatch`` on a single line, so no pattern spans lines (linear time).
_FENCE_OPEN = re.compile(r"[ \t]*```[ \t]*([\w+.#-]*).*")
_FENCE_CLOSE = re.compile(r"[ \t]*```[ \t]*")
_DIFF_SEARCH = re.compile(r"[ \t]*<{5,}[ \t]*SEARCH[ \t]*")
_DIFF_DIVIDE = re.compile(r"[ \t]*={5,}[ \t]*")
_DIFF_REPLACE = re.compile(r"[ \t]*>{5,}[ \t]*REPLACE[ \t]*")


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


class _Lines:
    """A text's lines (split on newlines) with their start offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.split("\n")
        self.starts: list[int] = []
        pos = 0
        for line in self.lines:
            self.starts.append(pos)
            pos += len(line) + 1

    def end(self, i: int) -> int:
        """Offset just past line ``i``'s last character (before its newline)."""
        return self.starts[i] + len(self.lines[i])

    def find(self, pattern: re.Pattern[str], start: int, need_newline: bool = False) -> int:
        """Index of the first line from ``start`` that ``pattern`` matches whole (-1: none)."""
        last = len(self.lines) - (1 if need_newline else 0)
        for i in range(start, last):
            if pattern.fullmatch(self.lines[i]):
                return i
        return -1


def _fence_spans(text: str) -> list[tuple[int, int, str, str]]:
    """(start, end, language tag, body) of each fenced block, as a multi-line regex would find them.

    An opener is a line starting with three backticks (followed by a newline); the block ends at the
    next line holding only three backticks. One pass over the lines: linear in the text's length.
    """
    t = _Lines(text)
    out: list[tuple[int, int, str, str]] = []
    i = 0
    while True:
        opener = t.find(_FENCE_OPEN, i, need_newline=True)
        if opener < 0:
            return out
        closer = t.find(_FENCE_CLOSE, opener + 1)
        if closer < 0:  # no closer after this opener: none after any later one either
            return out
        m = _FENCE_OPEN.fullmatch(t.lines[opener])
        assert m is not None
        body = text[t.starts[opener + 1] : t.starts[closer]]
        out.append((t.starts[opener], t.end(closer), m.group(1), body))
        i = closer + 1


def _diff_spans(text: str) -> list[tuple[int, int, str, str]]:
    """(start, end, search, replace) of each SEARCH/REPLACE block, in one pass over the lines."""
    t = _Lines(text)
    out: list[tuple[int, int, str, str]] = []
    i = 0
    while True:
        head = t.find(_DIFF_SEARCH, i, need_newline=True)
        if head < 0:
            return out
        mid = t.find(_DIFF_DIVIDE, head + 1, need_newline=True)
        tail = t.find(_DIFF_REPLACE, mid + 1) if mid >= 0 else -1
        if tail < 0:  # a later SEARCH line would find no divider/REPLACE line either
            return out
        search = text[t.starts[head + 1] : t.starts[mid]]
        replace = text[t.starts[mid + 1] : t.starts[tail]]
        out.append((t.starts[head], t.end(tail), search, replace))
        i = tail + 1


def _cut(text: str, spans: list[tuple[int, int, str, str]]) -> str:
    pieces, pos = [], 0
    for start, end, _, _ in spans:
        pieces.append(text[pos:start])
        pos = end
    return "".join(pieces) + text[pos:]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Fenced code blocks as (language tag, body), in order."""
    return [(lang.lower(), body) for _, _, lang, body in _fence_spans(text)]


def diff_blocks(text: str) -> list[tuple[str, str]]:
    """SEARCH/REPLACE blocks as (search, replace), in order."""
    return [(search, replace) for _, _, search, replace in _diff_spans(text)]


def _norm(line: str) -> str:
    return " ".join(line.split())


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


_MAX_PLACES = 100  # where a SEARCH text matches this often, counting stops (bounded time)


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
    starts = _line_matches(want, [x for _, x in body], limit=_MAX_PLACES)
    head = want[0][:60]
    if len(starts) > 1 or exact > 1:
        n = max(exact, len(starts))
        places = f"{n}{'+' if n >= _MAX_PLACES else ''} places"
        raise ParseFailure(f"SEARCH block matches {places} (first line: {head!r}); quote more lines")
    if not starts:
        raise ParseFailure(f"SEARCH block not found in the parent (first line: {head!r})")
    first, last = body[starts[0]][0], body[starts[0] + len(want) - 1][0]
    return "\n".join(src_lines[:first] + _reindent(search, replace, src_lines[first]) + src_lines[last + 1 :])


def _line_matches(want: list[str], have: list[str], limit: int) -> list[int]:
    """Indices where the lines ``want`` occur in ``have`` as a run (at most ``limit`` of them).

    Both are joined with newlines and searched with ``str.find`` (linear in practice), instead of
    comparing line by line at every start (quadratic on long replies).
    """
    if any("\n" in x for x in want) or len(want) > len(have):
        return []
    hay = "\n" + "\n".join(have) + "\n"
    needle = "\n" + "\n".join(want) + "\n"
    offsets, pos = [0], 0
    for line in have:  # offsets[k]: where line k's preceding newline sits in ``hay``
        pos += len(line) + 1
        offsets.append(pos)
    found: list[int] = []
    at = hay.find(needle)
    while at >= 0 and len(found) < limit:
        found.append(bisect.bisect_left(offsets, at))
        at = hay.find(needle, at + 1)
    return found


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


#: What parsing or evaluating literals of a hostile text may raise besides a syntax error.
_AST_ERRORS = (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, OverflowError)


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except _AST_ERRORS:
        return None


def _scalar(v: object) -> bool:
    return isinstance(v, int | float | str | bool)


def extract_params(source: str) -> dict[str, ParamValue]:
    """Template parameter values a Python candidate declares: the defaults of its
    ``PARAMS.get("NAME", default)`` reads, and any literal ``PARAMS = {...}`` dict."""
    try:
        tree = ast.parse(source)
    except _AST_ERRORS:
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
    except _AST_ERRORS:
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
    no_fences = _cut(text, _fence_spans(text))
    stripped = _cut(no_fences, _diff_spans(no_fences))
    return " ".join(stripped.split())[:600]


def _check_python(source: str) -> None:
    try:
        compile(source, "<candidate>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise ParseFailure(f"the code does not parse as Python: {exc.msg} at line {exc.lineno}") from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        raise ParseFailure(f"the code does not parse as Python: {type(exc).__name__}: {exc}"[:300]) from None
    if "class ModelNew" not in source:
        raise ParseFailure("the code defines no `class ModelNew`")


def parse_reply(
    text: object, kind: Literal["kernelbench", "native"], parent_source: str | None = None
) -> ParsedReply:
    """Parse a reply into source; raises :class:`ParseFailure` with a one-line reason."""
    if not isinstance(text, str) or not text.strip():
        raise ParseFailure("the reply was empty")
    if len(text) > MAX_REPLY_CHARS:
        raise ParseFailure(
            f"the reply is {len(text)} characters long, more than {MAX_REPLY_CHARS} (not parsed)"
        )
    diffs = diff_blocks(text)
    if len(diffs) > MAX_DIFFS:
        raise ParseFailure(f"the reply holds {len(diffs)} SEARCH/REPLACE diffs, more than {MAX_DIFFS}")
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
    # a native kernel: the blocks fenced with some registered language's name (or with none)
    kernel_fences = fence_names() | {""}
    chosen = [body for lang, body in blocks if lang.lower() in kernel_fences] or [b for _, b in blocks]
    return ParsedReply(max(chosen, key=len).rstrip() + "\n", "block", _rationale(text))
