"""``kf-run plugins``: every loaded plugin, its package, version, hooks and registered names."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from kfoundry.core.plugins import get_plugin_manager


def plugins_listing() -> list[dict[str, object]]:
    """One entry per loaded plugin, as plain data."""
    manager = get_plugin_manager()
    out: list[dict[str, object]] = []
    for info in sorted(manager.infos.values(), key=lambda i: i.name):
        out.append(
            {
                "name": info.name,
                "package": info.package,
                "version": info.version,
                "hooks": info.hooks,
                "registered": info.registered,
            }
        )
    return out


@click.command(
    "plugins",
    epilog="\b\nExamples:\n  kf-run plugins\n  kf-run plugins --json\n  KF_DISABLE_PLUGINS=ray kf-run plugins",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(as_json: bool) -> None:
    """List every plugin: name, kinds and names registered, package, version and hooks."""
    listing = plugins_listing()
    skipped = get_plugin_manager().skipped
    if as_json:
        click.echo(json.dumps({"plugins": listing, "skipped": skipped}, indent=2))
        return
    table = Table(title="kfoundry plugins")
    for col in ("plugin", "registers", "package", "version", "hooks"):
        table.add_column(col)
    for entry in listing:
        registered = entry["registered"]
        assert isinstance(registered, dict)
        regs = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in registered.items()) or "-"
        hooks = entry["hooks"]
        assert isinstance(hooks, list)
        table.add_row(
            str(entry["name"]), regs, str(entry["package"]), str(entry["version"]), ", ".join(hooks)
        )
    console = Console()
    console.print(table)
    for line in skipped:
        console.print(f"[yellow]{line}[/yellow]")
