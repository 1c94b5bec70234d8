"""``kf-run resume RUN_DIR``: continue a stopped or killed optimisation run where it left off."""

from __future__ import annotations

from pathlib import Path

import click

from kfoundry.core.config import load_config
from kfoundry.core.loop import read_run_file


@click.command("resume", epilog="\b\nExamples:\n  kf-run resume kf-runs/matmul-20261130-104500\n"
               "  kf-run resume kf-runs/matmul-20261130-104500 --set budget.generations=12")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Change a budget before continuing (e.g. budget.generations=12).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def command(run_dir: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Continue the run in RUN_DIR: stored proposals and finished evaluations are not repeated."""
    from kfoundry.api import resume
    from kfoundry.core.commands.optimize import cli_observer, finish

    folder = Path(run_dir)
    config = load_config(data=read_run_file(folder)["config"], overrides=list(overrides))
    observer = cli_observer(config)
    try:
        result = resume(folder, overrides=overrides, observer=observer)
    finally:
        if observer is not None:
            observer.stop()
    finish(result, as_json)
