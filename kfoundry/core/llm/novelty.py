"""Novelty filter: a proposal equal to one seen before (ignoring whitespace and comments) is dropped."""

from __future__ import annotations

import hashlib
import io
import re
import threading
import tokenize

_C_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_TRIPLE = re.compile(r'(r?"""|r?\'\'\')(.*?)\1', re.DOTALL)


def _strip_python_comments(source: str) -> str:
    try:
        tokens = [
            t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type != tokenize.COMMENT
        ]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.sub(r"(?m)#[^\n]*$", "", source)


def normalise_source(source: str) -> str:
    """Source without comments (C and Python style) and with all whitespace runs removed."""

    # Kernel code lives in Python string literals; strip C comments there and Python comments outside.
    def inner(m: re.Match[str]) -> str:
        return m.group(1) + _C_COMMENTS.sub(" ", m.group(2)) + m.group(1)

    text = _TRIPLE.sub(inner, source)
    text = (
        _strip_python_comments(text)
        if ("class " in text or "import " in text)
        else _C_COMMENTS.sub(" ", text)
    )
    return "".join(text.split())


def fingerprint(source: str, params: dict[str, object] | None = None) -> str:
    """Hash of the normalised source and parameter values."""
    blob = normalise_source(source) + "\x00" + repr(sorted((params or {}).items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class NoveltyFilter:
    """Remembers fingerprints; :meth:`admit` is True the first time a kernel is seen."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.rejected = 0

    def admit(self, source: str, params: dict[str, object] | None = None) -> bool:
        key = fingerprint(source, params)
        with self._lock:
            if key in self._seen:
                self.rejected += 1
                return False
            self._seen.add(key)
            return True

    def add(self, source: str, params: dict[str, object] | None = None) -> None:
        with self._lock:
            self._seen.add(fingerprint(source, params))

    def __contains__(self, source: object) -> bool:
        return isinstance(source, str) and fingerprint(source) in self._seen
