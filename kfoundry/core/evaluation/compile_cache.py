"""The compile cache: kernel artefacts (a cubin, an OpenCL program binary, a HIP code object) by key.

The key is computed by the trusted judge from exactly the compile's inputs (language, source, defines,
flags, backend options, toolchain version, target): :func:`compile_key`. Only the judge writes here,
and only what its confined compile step produced from those inputs, so a hostile candidate can at most
fill its own key. Entries live in a folder of the run (``<store folder>/compile-cache``): ``<key>.bin``
(the artefact) and ``<key>.json`` (its compiler log, resources and the artefact's sha256, checked on
every read), written atomically; the oldest entries are removed beyond the size bound.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfoundry.core.models import ParamValue


@dataclass
class Artifact:
    """A compiled program: its bytes and what the compiler said (log, resources, kernel names...)."""

    data: bytes
    meta: dict[str, Any] = field(default_factory=dict)


def compile_key(
    language: str,
    source: str,
    defines: dict[str, ParamValue] | None,
    build_options: list[str] | None,
    backend_options: dict[str, Any],
    toolchain: str,
    target: str,
) -> str:
    """sha256 over the compile's inputs, canonically encoded (defines sorted, values typed)."""
    payload = {
        "language": language,
        "source": source,
        "defines": sorted([k, type(v).__name__, repr(v)] for k, v in (defines or {}).items()),
        "build_options": list(build_options or []),
        "backend_options": json.dumps(backend_options, sort_keys=True, default=repr),
        "toolchain": toolchain,
        "target": target,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class CompileCache:
    """A size-bounded folder of artefacts by key (see module docstring)."""

    def __init__(self, folder: str | Path, max_bytes: int) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _paths(self, key: str) -> tuple[Path, Path]:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"not a compile key: {key[:80]!r}")
        return self.folder / f"{key}.bin", self.folder / f"{key}.json"

    def get(self, key: str) -> Artifact | None:
        """The artefact stored under ``key``, or None (missing, unreadable or not matching its hash)."""
        data_path, meta_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text())
            data = data_path.read_bytes()
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("sha256") != hashlib.sha256(data).hexdigest():
            return None
        with contextlib.suppress(OSError):
            os.utime(meta_path)  # recently used: evicted last
        return Artifact(data, meta)

    def put(self, key: str, artifact: Artifact) -> None:
        """Store ``artifact`` under ``key`` (atomically), then keep the folder within its bound."""
        data_path, meta_path = self._paths(key)
        if len(artifact.data) > self.max_bytes:
            return
        meta = {**artifact.meta, "sha256": hashlib.sha256(artifact.data).hexdigest()}
        _write(data_path, artifact.data)
        _write(meta_path, json.dumps(meta).encode())  # written last: an entry exists once its meta does
        self._evict()

    def size(self) -> int:
        """Bytes the entries take."""
        return sum(p.stat().st_size for p in self.folder.glob("*.bin") if p.is_file())

    def _evict(self) -> None:
        entries = []
        for meta_path in self.folder.glob("*.json"):
            data_path = meta_path.with_suffix(".bin")
            with contextlib.suppress(OSError):
                entries.append((meta_path.stat().st_mtime, data_path.stat().st_size, meta_path, data_path))
        total = sum(e[1] for e in entries)
        for _, size, meta_path, data_path in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            for path in (meta_path, data_path):
                with contextlib.suppress(OSError):
                    path.unlink()
            total -= size


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
