"""The ``kf-run`` command: a click group whose default command optimizes a problem.

Errors meant for people (:class:`KfError`) print one line and exit with status 2; ``--debug``
shows the traceback.
"""

from __future__ import annotations

import importlib
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
    "kfoundry.mcp.command",
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
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """kfoundry: find fast, correct GPU kernels automatically.

    Run ``kf-run PROBLEM`` to optimize a problem file, or one of the commands below.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


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


def _one_line_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> str:
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> Any:
    """Entry point of ``kf-run``."""
    warnings.formatwarning = _one_line_warning
    args = list(sys.argv[1:] if argv is None else argv)
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
