"""``kf-run runs [DIR]``: the run folders under DIR (default: the config's ``output_dir``), newest first."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kfoundry.core.config import load_config
from kfoundry.core.errors import ConfigError


def list_runs(root: Path) -> list[dict[str, Any]]:
    """An overview of every run folder directly under ``root`` (a broken one says why in ``status``)."""
    from kfoundry.core.report.data import RUN_FILE, RunFolderError, run_overview

    if not root.is_dir():
        raise ConfigError(f"runs folder not found: {root}")
    out = []
    for folder in sorted(p for p in root.iterdir() if (p / RUN_FILE).is_file()):
        try:
            out.append(run_overview(folder))
        except RunFolderError as exc:
            out.append(
                {
                    "run_dir": str(folder),
                    "run_id": folder.name,
                    "problem": "?",
                    "status": f"unreadable: {exc}",
                    "created_at": None,
                    "evaluations": 0,
                    "best_speedup": None,
                    "best_label": None,
                    "stop_reason": None,
                }
            )
    return sorted(out, key=lambda r: r["created_at"] or "", reverse=True)


@click.command("runs", epilog="\b\nExamples:\n  kf-run runs\n  kf-run runs /data/kf-runs --json")
@click.argument("root", metavar="[DIR]", required=False, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the runs as a JSON list.")
def command(root: str | None, as_json: bool) -> None:
    """List the runs under DIR: status, problem, best speedup, evaluations, when started."""
    folder = Path(root) if root else Path(load_config(None, []).output_dir)
    runs = list_runs(folder)
    if as_json:
        click.echo(json.dumps(runs, indent=2))
        return
    if not runs:
        click.echo(f"no runs under {folder}")
        return
    table = Table(title=f"{len(runs)} runs under {folder}")
    for col in ("run", "problem", "status", "best", "evaluations", "started"):
        table.add_column(col)
    for r in runs:
        best = f"{r['best_speedup']:.2f}x {r['best_label']}" if r["best_speedup"] else "-"
        table.add_row(
            r["run_id"],
            r["problem"],
            r["status"],
            best,
            str(r["evaluations"]),
            (r["created_at"] or "-")[:19].replace("T", " "),
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)
