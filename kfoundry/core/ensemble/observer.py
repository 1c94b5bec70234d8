"""The ensemble's pluggy plugin: the lifecycle hooks feed it results and collect its usage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kfoundry import hookimpl
from kfoundry.core.models import Candidate, EvalRecord
from kfoundry.core.payloads import GenerationSummary, RunSummary
from kfoundry.core.plugins import PluginManager

if TYPE_CHECKING:
    from kfoundry.core.ensemble.members import Ensemble


class EnsembleObserver:
    """Pluggy plugin forwarding lifecycle hooks to an :class:`Ensemble`."""

    def __init__(self, ensemble: Ensemble, manager: PluginManager, name: str) -> None:
        self.ensemble, self.manager, self.name = ensemble, manager, name

    @hookimpl
    def kf_candidate_evaluated(self, candidate: Candidate, record: EvalRecord) -> None:
        self.ensemble.observe(candidate, record)

    @hookimpl
    def kf_generation_finished(self, run_id: str, generation: int, summary: GenerationSummary) -> None:
        self.ensemble.end_generation(generation)
        summary.extra.setdefault("llm", self.ensemble.usage())

    @hookimpl
    def kf_run_finished(self, run_id: str, summary: RunSummary) -> None:
        summary.extra.setdefault("llm", self.ensemble.usage())
        self.ensemble.detach()
