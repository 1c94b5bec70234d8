"""``kf-run doctor``: which sandbox protections are in force on this machine, each tested for real."""

from __future__ import annotations

import json
from dataclasses import asdict

import click
from rich.console import Console
from rich.table import Table

from kfoundry.core.evaluation.confine_probe import probe


@click.command("doctor", epilog="\b\nExamples:\n  kf-run doctor\n  kf-run doctor --json")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(as_json: bool) -> None:
    """Confine a child process as candidates are, try what each protection forbids, and report."""
    found = probe()
    if as_json:
        click.echo(json.dumps({"protections": [asdict(p) for p in found]}, indent=2))
        return
    table = Table(title="kfoundry sandbox")
    for col in ("protection", "status", "detail"):
        table.add_column(col)
    for p in found:
        status = "[green]in force[/green]" if p.in_force else "[red]not in force[/red]"
        table.add_row(p.name, status, p.detail)
    Console().print(table)
