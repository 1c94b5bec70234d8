"""The typed payloads of the lifecycle hooks: what a run tells plugins when it starts, after each
generation and when it ends.

The loop builds these; plugins receive them through :mod:`kfoundry.core.hookspecs`. A plugin that
wants to hand something to the others (or to the run record) puts it under ``extra`` with a key of
its own: the LLM ensemble adds ``extra["llm"]``, its calls, tokens and spend.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kfoundry.core.config import RunConfig, resolved_config
from kfoundry.core.models import ParamValue
from kfoundry.core.plugins import PluginManager

__all__ = ["GenerationSummary", "RunSummary", "resolved_run_config"]


_EXTRA = "What plugins add, one key per plugin (the LLM ensemble: ``llm``)."


class _Payload(BaseModel):
    """Base of the hook payloads: unknown fields are errors, plugins add theirs under ``extra``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GenerationSummary(_Payload):
    """The state of a run after one search generation (``kf_generation_finished``)."""

    evaluations: int = Field(ge=0, description="Evaluations of the run so far, cached ones included.")
    best_speedup: float | None = Field(
        default=None, description="Speedup of the best kernel; None: none correct."
    )
    coverage: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Share of archive cells holding a kernel."
    )
    extra: dict[str, Any] = Field(default_factory=dict, description=_EXTRA)


class RunSummary(_Payload):
    """How a run ended (``kf_run_finished``; also what the store keeps as the run's summary)."""

    run_id: str
    run_dir: str = Field(description="The run folder.")
    stop_reason: str = Field(description="Why the run stopped: the budget that ran out, or the error.")
    generations: int = Field(ge=0, description="Generations completed.")
    evaluations: int = Field(ge=0, description="Evaluations made, cached ones included.")
    coverage: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Share of archive cells holding a kernel."
    )
    best_label: str | None = Field(default=None, description="Label of the best kernel (None: none correct).")
    best_params: dict[str, ParamValue] | None = Field(default=None, description="Its template parameters.")
    best_outcome: str | None = Field(default=None, description="Its evaluation outcome.")
    best_speedup: float | None = Field(default=None, description="Its speedup over the reference.")
    best_ms: float | None = Field(default=None, description="Its median time in milliseconds.")
    speedup_over_seed: float | None = Field(default=None, description="Seed kernel's time over the best's.")
    exported: str | None = Field(default=None, description="Where the best kernel was exported, if it was.")
    extra: dict[str, Any] = Field(default_factory=dict, description=_EXTRA)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (the form the store and ``kf-run runs`` keep)."""
        return self.model_dump(mode="json")


def resolved_run_config(config: RunConfig, manager: PluginManager | None = None) -> RunConfig:
    """``config`` with every named plugin's option defaults filled in (the ``kf_run_started`` payload)."""
    return RunConfig.model_validate(resolved_config(config, manager))
