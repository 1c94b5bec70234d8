"""What the offline-compiler backends (CUDA, HIP) share: ``-D`` flags, kernel symbol names, running
the compiler (nvcc, hipcc) on one candidate, and the stand-in for a kernel that cannot run here."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kfoundry.core.backend import CompileFailed
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.models import ParamValue

__all__ = ["define_flags", "first_error", "kernel_short_name", "run_compiler", "unrunnable_kernel"]


def define_flags(defines: dict[str, ParamValue] | None) -> list[str]:
    """``-DNAME=VALUE`` flags (booleans as 1/0)."""
    flags = []
    for name, value in (defines or {}).items():
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise CompileFailed(f"bad define name {name!r}")
        text = str(int(value)) if isinstance(value, bool) else str(value)
        flags.append(f"-D{name}={text}")
    return flags


def kernel_short_name(symbol: str) -> str:
    """The source name of a kernel symbol: ``add`` for ``add`` and for the mangled ``_Z3addPfS_i``."""
    mangled = re.match(r"_Z(\d+)(\w+)", symbol)
    if mangled:
        length = int(mangled.group(1))
        return mangled.group(2)[:length]
    return symbol


def first_error(log: str) -> str:
    """The first line of a compiler log that mentions an error ("" if none)."""
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()
    return ""


def run_compiler(
    tool: str,
    cmd: list[str],
    out: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> tuple[bytes, str]:
    """Run ``cmd``, which must write ``out``: (the bytes it wrote, the log), or :class:`CompileFailed`
    naming the first error, with the whole log attached."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise CompileFailed(f"{tool} did not finish within {timeout_s:.0f} s") from None
    log = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or not out.is_file():
        raise CompileFailed(first_error(log) or f"{tool} exited with {proc.returncode}", log=log)
    return out.read_bytes(), log


def unrunnable_kernel(message: str) -> Callable[..., None]:
    """A compile-only module's kernel: calling it raises :class:`BackendUnavailable` with ``message``."""

    def launch(*args: Any, **kwargs: Any) -> None:
        raise BackendUnavailable(message)

    return launch
