"""Typed wrappers: the only way the core calls lifecycle hooks."""

from __future__ import annotations

from typing import Any

from kfoundry.core.models import Candidate, EvalRecord
from kfoundry.core.plugins import PluginManager, get_plugin_manager


def _hook(manager: PluginManager | None) -> Any:
    return (manager or get_plugin_manager()).hook


def static_checks(candidate: Candidate, problem_name: str, manager: PluginManager | None = None) -> list[str]:
    """Reasons any plugin gives to reject ``candidate`` before compiling (empty: accepted)."""
    results = _hook(manager).kf_static_checks(candidate=candidate, problem_name=problem_name)
    return [reason for reasons in results if reasons for reason in reasons]


def candidate_evaluated(candidate: Candidate, record: EvalRecord, manager: PluginManager | None = None) -> None:
    """Tell plugins that ``candidate`` was evaluated."""
    _hook(manager).kf_candidate_evaluated(candidate=candidate, record=record)


def generation_finished(
    run_id: str, generation: int, summary: dict[str, Any], manager: PluginManager | None = None
) -> None:
    """Tell plugins that a search generation ended."""
    _hook(manager).kf_generation_finished(run_id=run_id, generation=generation, summary=summary)


def run_started(run_id: str, config: dict[str, Any], manager: PluginManager | None = None) -> None:
    """Tell plugins that a run started."""
    _hook(manager).kf_run_started(run_id=run_id, config=config)


def run_finished(run_id: str, summary: dict[str, Any], manager: PluginManager | None = None) -> None:
    """Tell plugins that a run ended."""
    _hook(manager).kf_run_finished(run_id=run_id, summary=summary)
