"""The ``kf-run`` command: a click group whose default command optimizes a problem.

Errors meant for people (:class:`KfError`) print one line and exit with status 2; ``--debug``
shows the traceback.
"""

from __future__ import annotations

import importlib
import logging
import sqlite3
import sys
import traceback
import warnings
from typing import Any

import click

from kfoundry import __version__
from kfoundry.core.errors import KfError

#: Subcommand modules; each defines ``command`` (a click command). ``optimize`` is the default.
COMMAND_MODULES = [
    "kfoundry.core.commands.optimize",
    "kfoundry.core.commands.resume",
    "kfoundry.core.commands.plugins",
    "kfoundry.core.commands.config",
    "kfoundry.core.commands.eval",
    "kfoundry.core.commands.tune",
    "kfoundry.core.commands.devices",
    "kfoundry.core.commands.replay",
    "kfoundry.core.commands.llm_calls",
    "kfoundry.core.commands.doctor",
    "kfoundry.core.commands.runs",
    "kfoundry.core.commands.show",
]

DEFAULT_COMMAND = "optimize"


class DefaultGroup(click.Group):
    """A group that runs ``optimize`` when the first argument is not a subcommand (``kf-run PROBLEM``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        first = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
        if first is not None and args[first] not in self.commands:
            args = args[:first] + [DEFAULT_COMMAND] + args[first:]
        return super().parse_args(ctx, args)


@click.group(
    cls=DefaultGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Examples:
  kf-run examples/kernelbench/matmul.py            optimize on the default (OpenCL, offline generator)
  kf-run examples/kernelbench/softmax.py --config kf.toml --set budget.generations=4
  kf-run eval examples/kernelbench/softmax.py examples/kernelbench/seeds/softmax_opencl.py
  kf-run resume kf-runs/softmax-20261130-104500
  kf-run plugins --json
  kf-run config --show
""",
)
@click.version_option(__version__, prog_name="kf-run")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.option(
    "-v", "--verbose", count=True, help="More log lines (-vv: debug); allowed anywhere on the line."
)
@click.option("-q", "--quiet", is_flag=True, help="Warnings and errors only; allowed anywhere on the line.")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: int, quiet: bool) -> None:
    """kfoundry: find fast, correct GPU kernels automatically.

    Run ``kf-run PROBLEM`` to optimize a problem file, or one of the commands below.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    ctx.obj["terminal"] = configure_logging(verbose, quiet)


#: The stderr console of a terminal session: log records and the progress bar share it.
terminal_console: Any = None


def configure_logging(verbose: int = 0, quiet: bool = False, stream: Any = None) -> bool:
    """Send the ``kfoundry`` loggers to stderr; True when it is a terminal (a progress bar is drawn).

    On a terminal, records go through rich at WARNING (INFO with ``-v``), the progress bar showing
    the rest; otherwise plain timestamped lines at INFO, one per evaluation and per generation
    (``-q``: WARNING, ``-v``: DEBUG).
    """
    stream = stream or sys.stderr
    terminal = bool(getattr(stream, "isatty", lambda: False)())
    logger = logging.getLogger("kfoundry")
    for old in [h for h in logger.handlers if h.get_name() == "kf-run"]:
        logger.removeHandler(old)
    handler: logging.Handler
    if terminal:
        from rich.console import Console
        from rich.logging import RichHandler

        global terminal_console
        terminal_console = Console(file=stream)
        handler = RichHandler(console=terminal_console, show_path=False, markup=False)
        level = (
            logging.WARNING if quiet else {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
        )
    else:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        level = logging.WARNING if quiet else (logging.INFO if verbose == 0 else logging.DEBUG)
    handler.set_name("kf-run")
    logger.addHandler(handler)
    logger.setLevel(level)
    return terminal


def _register_commands() -> None:
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # command not built yet in this checkout
                continue
            raise
        cli.add_command(module.command)


_register_commands()


def _register_plugin_commands() -> None:
    """Commands that plugins add through ``kf_register_commands`` (report and export are such plugins)."""
    from kfoundry.core import hooks

    hooks.register_commands(cli)


_register_plugin_commands()

#: Flags of the group that may appear anywhere on the command line (moved before the subcommand).
_ANYWHERE_FLAGS = {"-v", "-vv", "-vvv", "--verbose", "-q", "--quiet", "--debug"}


def _one_line_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> str:
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> Any:
    """Entry point of ``kf-run``."""
    warnings.formatwarning = _one_line_warning
    args = list(sys.argv[1:] if argv is None else argv)
    cut = args.index("--") if "--" in args else len(args)
    hoisted = [a for a in args[:cut] if a in _ANYWHERE_FLAGS]
    args = hoisted + [a for a in args[:cut] if a not in _ANYWHERE_FLAGS] + args[cut:]
    debug = "--debug" in args
    try:
        return cli.main(args=args, prog_name="kf-run", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except KfError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except (OSError, sqlite3.Error) as exc:  # the environment: full disk, read-only, a file for a folder
        if debug:
            traceback.print_exc()
        click.echo(f"error: {environment_error(exc)}", err=True)
        sys.exit(2)


def environment_error(exc: OSError | sqlite3.Error) -> str:
    """One line naming the path (where known) and the cause of an environment failure."""
    if isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else ""
        cause = exc.strerror or str(exc) or type(exc).__name__
        more = f" -> {exc.filename2}" if exc.filename2 is not None else ""
        return f"{where}{more}: {cause}" if where else cause
    return f"store: {type(exc).__name__}: {' '.join(str(exc).split())}"
