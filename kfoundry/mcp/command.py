"""``kf-run mcp``: serve kfoundry's tools to an MCP client (a coding agent) over stdio.

A plugin of kfoundry's own (entry point ``mcp``): the command is added through ``kf_register_commands``.
This module stays light (click only); the SDK is imported when the command runs.
"""

from __future__ import annotations

import logging
import sys

import click

from kfoundry import hookimpl
from kfoundry.core.errors import KfError


class McpUnavailable(KfError):
    """The MCP SDK is not installed."""


@click.command(
    "mcp",
    epilog="""\b
Examples:
  kf-run mcp
  kf-run mcp --runs-root ~/kf-runs --set evaluation.target_time_s=0.1
  python -m kfoundry.mcp --config kf.toml
""",
)
@click.option(
    "--runs-root", type=click.Path(file_okay=False), help="Where run folders live (default: output_dir)."
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML base run config.")
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a base config value."
)
@click.option(
    "--log-level",
    default="WARNING",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
    help="Server log level (stderr).",
)
def command(
    runs_root: str | None, config_path: str | None, overrides: tuple[str, ...], log_level: str
) -> None:
    """Serve the Model Context Protocol on stdin/stdout: evaluate kernels, run and search optimisations."""
    try:
        import anyio

        from kfoundry.mcp.server import serve_stdio
    except ImportError as exc:
        if not (exc.name or "").startswith(("mcp", "anyio")):
            raise
        raise McpUnavailable("kf-run mcp needs the MCP SDK: pip install 'kfoundry[mcp]'") from None
    from kfoundry.mcp.settings import ServerSettings

    logging.basicConfig(stream=sys.stderr, level=log_level, format="kf-run mcp: %(levelname)s %(message)s")
    settings = ServerSettings.create(runs_root, config_path, overrides)
    anyio.run(serve_stdio, settings)


@hookimpl
def kf_register_commands(cli: click.Group) -> None:
    """Add ``kf-run mcp``."""
    cli.add_command(command)
