"""The standards hold in CI, not only on a developer's machine: ruff-clean everywhere, formatted by
``ruff format`` everywhere, and mypy-clean (every function typed, see ``[tool.mypy]`` in
pyproject.toml) across the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_format_changes_nothing() -> None:
    done = _run("ruff", "format", "--check", ".")
    assert done.returncode == 0, "run `ruff format .`:\n" + done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_finds_nothing_in_the_package() -> None:
    done = _run("mypy")
    assert done.returncode == 0 and "Success" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


def test_no_core_module_is_over_400_lines() -> None:
    """Issue 15's rule: the core stays in small modules (a module that grows past it gets split)."""
    core = Path(__file__).resolve().parent.parent / "kfoundry" / "core"
    long = {
        str(p.relative_to(core)): n
        for p in core.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long
