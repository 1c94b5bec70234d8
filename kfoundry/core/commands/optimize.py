"""``kf-run PROBLEM``: optimize a problem (the main job)."""

from __future__ import annotations

import click

from kfoundry.core.config import load_config
from kfoundry.core.errors import KfError


@click.command("optimize")
@click.argument("problem", required=False)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML run config.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a config value.")
def command(problem: str | None, config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Optimize PROBLEM (a KernelBench .py file or a native task .toml)."""
    load_config(config_path, overrides)
    raise KfError("the optimize loop is not built yet in this checkout")
