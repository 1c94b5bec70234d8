"""``kf-run config``: validate a config and show it resolved, with every default filled in."""

from __future__ import annotations

import click
import tomli_w

from kfoundry.core.config import load_config, resolved_config


def _drop_none(value: object) -> object:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


@click.command(
    "config",
    epilog="\b\nExamples:\n  kf-run config --show\n  kf-run config --config kf.toml --set search.name=ga --show",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML run config.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a config value.")
@click.option("--show", is_flag=True, help="Print the resolved config as TOML (unset values omitted).")
def command(config_path: str | None, overrides: tuple[str, ...], show: bool) -> None:
    """Validate a run config; with --show print it resolved, with every default."""
    config = load_config(config_path, overrides)
    if show:
        click.echo(tomli_w.dumps(_drop_none(resolved_config(config))))  # type: ignore[arg-type]
    else:
        click.echo(f"config OK{f' ({config_path})' if config_path else ''}")
