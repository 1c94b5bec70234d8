"""Run folders: a fresh folder per run, the run file ``kf-run resume`` rebuilds a run from, the
store's file name, and the examples' convention for a problem's naive seed kernel."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from kfoundry.core.config import RunConfig
from kfoundry.core.run.state import LoopError

RUN_FILE = "run.json"
STORE_FILE = "kfoundry.db"


def new_run_dir(config: RunConfig, problem_name: str) -> tuple[str, Path]:
    """A fresh run id and folder under ``config.output_dir``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(config.output_dir) / f"{problem_name}-{stamp}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    path.mkdir(parents=True)
    return path.name, path


def write_run_file(
    run_dir: Path,
    run_id: str,
    problem_path: Path,
    shapes: dict[str, Any],
    config: RunConfig,
    seed_kernel: Path | None,
    shape_sets: list[dict[str, Any]] | None = None,
) -> None:
    """What ``kf-run resume`` needs to rebuild the run (``shape_sets``: a multi-shape run's sets)."""
    data: dict[str, Any] = {
        "run_id": run_id,
        "problem": str(problem_path.resolve()),
        "shapes": shapes,
        "config": config.model_dump(mode="json"),
        "seed_kernel": str(seed_kernel.resolve()) if seed_kernel else None,
    }
    if shape_sets and len(shape_sets) > 1:
        data["shape_sets"] = shape_sets
    (run_dir / RUN_FILE).write_text(json.dumps(data, indent=2))


def run_shape_sets(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The shape sets of a run read from its ``run.json`` (one set for a single-shape run)."""
    sets = info.get("shape_sets")
    return [dict(s) for s in sets] if sets else [dict(info.get("shapes") or {})]


def read_run_file(run_dir: Path) -> dict[str, Any]:
    """A run folder's ``run.json`` (one :class:`LoopError` line when missing or unreadable)."""
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        raise LoopError(f"{run_dir}: not a kfoundry run folder (no {RUN_FILE})")
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise LoopError(f"{path}: unreadable run file: {exc}") from None
    return data


def find_seed_kernel(problem_path: Path, language: str) -> Path | None:
    """The problem's naive seed kernel by the examples' convention: ``seeds/<stem>_<language>.py``."""
    path = problem_path.parent / "seeds" / f"{problem_path.stem}_{language}.py"
    return path if path.is_file() else None
