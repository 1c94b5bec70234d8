"""Typed wrappers: the only way the core calls lifecycle hooks.

The run hooks take the payload models of :mod:`kfoundry.core.payloads` and the run config; anything
else (a plain dict) is refused here, in one line, not inside some plugin.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from kfoundry.core.config import RunConfig
from kfoundry.core.models import Candidate, EvalRecord
from kfoundry.core.payloads import GenerationSummary, RunSummary
from kfoundry.core.plugins import PluginManager, PluginWarning, get_plugin_manager

if TYPE_CHECKING:
    import click

_M = TypeVar("_M", bound=BaseModel)


def _hook(manager: PluginManager | None) -> Any:
    return (manager or get_plugin_manager()).hook


def _payload(model: type[_M], value: _M, what: str) -> _M:
    """``value``, checked to be a ``model`` (a dict would reach plugins that expect the model)."""
    if not isinstance(value, model):
        raise TypeError(f"{what} must be a {model.__name__}, got {type(value).__name__}")
    return value


def static_checks(candidate: Candidate, problem_name: str, manager: PluginManager | None = None) -> list[str]:
    """Reasons any plugin gives to reject ``candidate`` before compiling (empty: accepted)."""
    results = _hook(manager).kf_static_checks(candidate=candidate, problem_name=problem_name)
    return [reason for reasons in results if reasons for reason in reasons]


def candidate_evaluated(
    candidate: Candidate, record: EvalRecord, manager: PluginManager | None = None
) -> None:
    """Tell plugins that ``candidate`` was evaluated."""
    _hook(manager).kf_candidate_evaluated(candidate=candidate, record=record)


def generation_finished(
    run_id: str,
    generation: int,
    summary: GenerationSummary,
    manager: PluginManager | None = None,
) -> GenerationSummary:
    """Tell plugins that a search generation ended; returns the summary with what plugins added."""
    payload = _payload(GenerationSummary, summary, "generation_finished: summary")
    _hook(manager).kf_generation_finished(run_id=run_id, generation=generation, summary=payload)
    return payload


def run_started(run_id: str, config: RunConfig, manager: PluginManager | None = None) -> None:
    """Tell plugins that a run started (``config``: the resolved config, see ``resolved_run_config``)."""
    _hook(manager).kf_run_started(run_id=run_id, config=_payload(RunConfig, config, "run_started: config"))


def run_finished(run_id: str, summary: RunSummary, manager: PluginManager | None = None) -> RunSummary:
    """Tell plugins that a run ended; returns the summary with what plugins added under ``extra``."""
    payload = _payload(RunSummary, summary, "run_finished: summary")
    _hook(manager).kf_run_finished(run_id=run_id, summary=payload)
    return payload


def register_commands(cli: click.Group, manager: PluginManager | None = None) -> list[str]:
    """Let plugins add subcommands to ``cli``; returns the names added. A plugin may not replace a
    command that exists already, and one whose hook raises costs a one-line warning, not the tool."""
    before = dict(cli.commands)
    pm = (manager or get_plugin_manager()).pm
    for impl in pm.hook.kf_register_commands.get_hookimpls():
        try:
            impl.function(cli=cli)
        except Exception as exc:  # a broken plugin must not take kf-run down
            warnings.warn(
                f"kfoundry: plugin {impl.plugin_name!r} could not add commands: {type(exc).__name__}: {exc}",
                PluginWarning,
                stacklevel=2,
            )
    for name, command in before.items():
        if cli.commands.get(name) is not command:
            cli.commands[name] = command
            warnings.warn(
                f"kfoundry: a plugin tried to replace the kf-run command {name!r}; kept the built-in one",
                PluginWarning,
                stacklevel=2,
            )
    return sorted(set(cli.commands) - set(before))
