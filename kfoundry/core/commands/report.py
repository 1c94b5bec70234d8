"""``kf-run report RUN_DIR``: write (again) the run's self-contained HTML report.

A plugin of kfoundry's own: the command is added through ``kf_register_commands``.
"""

from __future__ import annotations

from pathlib import Path

import click

from kfoundry import hookimpl


@click.command(
    "report",
    epilog="\b\nExamples:\n  kf-run report kf-runs/softmax-20261201-101500\n"
    "  kf-run report kf-runs/softmax-20261201-101500 -o /tmp/softmax.html",
)
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "-o", "--out", type=click.Path(dir_okay=False), help="Where to write it (default RUN_DIR/report.html)."
)
def command(run_dir: str, out: str | None) -> None:
    """Write RUN_DIR's report: one HTML file with its charts inlined (opens offline)."""
    from kfoundry.core.errors import KfError
    from kfoundry.core.report import write_report

    try:
        path = write_report(Path(run_dir), out)
    except ImportError as exc:  # plotly missing: the report extra
        raise KfError(str(exc)) from None
    click.echo(f"report: {path}")


@hookimpl
def kf_register_commands(cli: click.Group) -> None:
    """Add ``kf-run report``."""
    cli.add_command(command)
