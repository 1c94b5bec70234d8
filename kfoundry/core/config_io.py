"""Reading a run config: TOML files, ``--set`` overrides, and validation errors on one line.

Every failure is one :class:`ConfigError` line that names where the problem is (the file, the key
path) and what it is.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kfoundry.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "apply_override",
    "format_validation_error",
    "parse_override",
    "parse_toml",
    "read_toml",
    "short_repr",
]


def _format_location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if not isinstance(part, int) and not _PLAIN_KEY.fullmatch(str(part)):
            part = short_repr(part, 40)  # a key with spaces, newlines or dots: quoted
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,60}")


def format_validation_error(exc: ValidationError, prefix: str = "", source: str = "") -> str:
    """One line: where the first problem is and what it is."""
    err = exc.errors()[0]
    loc = _format_location(tuple(err["loc"]))
    if prefix:
        loc = f"{prefix}.{loc}" if loc != "(top level)" else prefix
    where = f" in {source}" if source else ""
    if err["type"] == "extra_forbidden":
        return f"config error{where}: unknown key {loc}"
    more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    msg = " ".join(str(err["msg"]).split())[:300]
    return f"config error{where}: {loc}: {msg} (got {short_repr(err.get('input'))}){more}"


def short_repr(value: Any, limit: int = 120) -> str:
    """``repr`` on one line, cut to ``limit`` characters (a hostile value may be huge)."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails says nothing useful; the type does
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_INDEX = re.compile(r"[0-9]{1,6}")


def _index(part: str) -> int | None:
    """``part`` as a list index (ASCII digits only), else None."""
    return int(part) if _INDEX.fullmatch(part) else None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a","b","c"], value); the value is read as TOML, else as a string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY.PATH=VALUE")
    key, raw = text.split("=", 1)
    path = [p.strip() for p in key.strip().split(".") if p.strip()]
    if not path:
        raise ConfigError(f"--set {short_repr(text)}: empty key")
    value: Any = raw.strip()
    try:
        doc = tomllib.loads(f"v = {raw.strip()}")
    except (tomllib.TOMLDecodeError, RecursionError, MemoryError, ValueError):
        return path, value  # not a TOML value: the text itself
    if set(doc) == {"v"}:  # a value with a newline could smuggle in more keys: then it is text
        value = doc["v"]
    return path, value


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``data[path[0]][path[1]]... = value``; ``llms.0.name`` indexes into lists."""
    where = short_repr(".".join(path))
    node: Any = data
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            idx = _index(part)
            if idx is None or idx >= len(node):
                raise ConfigError(f"--set {where}: no list item {short_repr(part)}")
            if last:
                node[idx] = value
            else:
                node = node[idx]
            continue
        if not isinstance(node, dict):
            above = ".".join(path[:i]) or "(top level)"
            raise ConfigError(
                f"--set {where}: {short_repr(above)} holds a value ({type(node).__name__}), not a table"
            )
        if last:
            node[part] = value
            break
        nxt = node.get(part)
        if nxt is None:
            nxt = [{}] if part == "llms" and _index(path[i + 1]) == 0 else {}
            node[part] = nxt
        node = nxt


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {p}: {exc}") from None
    return parse_toml(text, str(p))


def parse_toml(text: str, source: str = "") -> dict[str, Any]:
    """A TOML document as data; every failure is one :class:`ConfigError` line naming ``source``."""
    where = f" in {source}" if source else ""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config error{where}: {exc}") from None
    except (RecursionError, MemoryError, ValueError) as exc:  # nesting deeper than the parser allows
        raise ConfigError(f"config error{where}: unreadable TOML ({type(exc).__name__})") from None
