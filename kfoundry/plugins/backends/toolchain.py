"""Running an offline compiler (nvcc, hipcc) on one candidate: the shared subprocess step."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kfoundry.core.backend import CompileFailed


def first_error(log: str) -> str:
    """The first line of a compiler log that mentions an error ("" if none)."""
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()
    return ""


def run_compiler(
    tool: str, cmd: list[str], out: Path, timeout_s: float, env: dict[str, str] | None = None, cwd: str | None = None
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
