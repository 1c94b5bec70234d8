"""``kf-run export RUN_DIR --to DIR``: the run's kernels as an importable package with a dispatch table.

A plugin of kfoundry's own: the command is added through ``kf_register_commands``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from kfoundry import hookimpl


@click.command(
    "export",
    epilog="\b\nExamples:\n  kf-run export kf-runs/softmax-20261201-101500 --to softmax_kernels\n"
    "  kf-run export kf-runs/softmax-20261201-101500 --to build/softmax_kernels --header --json",
)
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Path(),
    help="The package folder to write (its name is the import name).",
)
@click.option("--header", is_flag=True, help="Also write a C header of per-device, per-shape #defines.")
@click.option(
    "--verify",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Fresh-input checks of each entry against the reference before it is kept (0: none).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def command(run_dir: str, to: str, header: bool, verify: int, as_json: bool) -> None:
    """Export RUN_DIR's fastest kernel per shape set as a package: a function and an nn.Module that check
    shapes, dtypes and device before launching, and fall back to the PyTorch reference (one warning)."""
    from kfoundry.api import export

    result = export(Path(run_dir), Path(to), header=header, verify=verify)
    if as_json:
        click.echo(json.dumps(result.model_dump(mode="json"), indent=2))
        return
    click.echo(f"exported {result.entries} dispatch entries to {result.package_dir} (import {result.module})")
    for why in result.rejected:
        click.echo(f"left out (failed the check here; the reference runs instead): {why}")
    if result.header:
        click.echo(f"header: {result.header}")


@hookimpl
def kf_register_commands(cli: click.Group) -> None:
    """Add ``kf-run export``."""
    cli.add_command(command)
