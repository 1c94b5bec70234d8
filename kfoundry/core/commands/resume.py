"""``kf-run resume RUN_DIR``: continue a stopped or killed optimisation run where it left off."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from kfoundry.core.config import load_config
from kfoundry.core.loop import read_run_file


@click.command("resume", epilog="\b\nExamples:\n  kf-run resume kf-runs/matmul-20261130-104500\n"
               "  kf-run resume kf-runs/matmul-20261130-104500 --set budget.generations=12")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Change a budget before continuing (e.g. budget.generations=12).")
def command(run_dir: str, overrides: tuple[str, ...]) -> None:
    """Continue the run in RUN_DIR: stored proposals and finished evaluations are not repeated."""
    from kfoundry.core.commands.optimize import run_loop

    folder = Path(run_dir)
    info = read_run_file(folder)
    config = load_config(data=info["config"], overrides=list(overrides))
    seed = Path(info["seed_kernel"]) if info.get("seed_kernel") else None
    run_loop(config, Path(info["problem"]), dict(info.get("shapes") or {}), info["run_id"], folder, seed, Console())
