"""What an optimisation run keeps and reports: the saved loop state, the summary, typed stop reasons,
and the contracts of the evaluator and observer the loop is given."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from kfoundry.core.backend import Backend
from kfoundry.core.config import RunConfig
from kfoundry.core.db.loop import Row
from kfoundry.core.errors import KfError
from kfoundry.core.models import Candidate, DeviceProfile, EvalRecord
from kfoundry.core.payloads import RunSummary
from kfoundry.core.problem import Problem
from kfoundry.core.search import SearchResult
from kfoundry.core.store import Store

if TYPE_CHECKING:
    from kfoundry.core.loop import OptimizeLoop


class LoopError(KfError):
    """The loop cannot start or continue (unsupported problem, missing run files)."""


class LoopState(BaseModel):
    """Everything the loop needs to continue, besides the stored proposals."""

    generation: int = 0
    elapsed_s: float = 0.0
    best_fitness: float = -1.0
    stagnant: int = 0
    tuning_evaluations: int = 0
    tuned_generations: list[int] = Field(default_factory=list)
    status: str = "running"
    stop_reason: str = ""
    strategy: dict[str, Any] | None = None


class StopKind(Enum):
    """Why a run stops."""

    WALL_TIME = "wall_time"
    EVALUATIONS = "evaluations"
    GENERATIONS = "generations"
    STAGNATION = "stagnation"
    LLM_BUDGET = "llm_budget"
    GENERATOR = "generator"


@dataclass(frozen=True)
class Stop:
    """A reason to stop, and its words for people (``LoopState.stop_reason``)."""

    kind: StopKind
    text: str

    @property
    def device_budget_spent(self) -> bool:
        """The wall time or evaluations are spent: nothing more may be evaluated (no final tuning)."""
        return self.kind in (StopKind.WALL_TIME, StopKind.EVALUATIONS)


class RunEvaluator(Protocol):
    """What the loop needs of an evaluator (:class:`~kfoundry.core.evaluation.Evaluator`, or
    :class:`~kfoundry.core.run.shapes.ShapeSetEvaluator` over several shape sets)."""

    problem: Problem
    config: RunConfig
    store: Store | None
    run_id: str | None
    backend: Backend

    @property
    def device(self) -> DeviceProfile: ...

    @property
    def backend_name(self) -> str: ...

    def evaluate(self, candidate: Candidate) -> EvalRecord: ...

    def evaluate_many(
        self, candidates: list[Candidate], on_record: Callable[[int, EvalRecord], None] | None = None
    ) -> list[EvalRecord]: ...


class LoopObserver(Protocol):
    """What the loop reports while it runs (the CLI draws a progress bar from it)."""

    def started(self, loop: OptimizeLoop) -> None: ...

    def evaluated(self, loop: OptimizeLoop, row: Row) -> None: ...

    def generation_done(self, loop: OptimizeLoop, generation: int) -> None: ...

    def note(self, loop: OptimizeLoop, text: str) -> None: ...


@dataclass
class LoopSummary:
    """How a run ended, with the best kernel's candidate and record (see :meth:`payload`)."""

    run_id: str
    run_dir: Path
    stop_reason: str
    generations: int
    evaluations: int
    best: SearchResult | None
    seed_record: EvalRecord | None
    coverage: float
    exported: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup_over_seed(self) -> float | None:
        """Best time over the naive seed's time (both measured by the same harness)."""
        if not (self.best and self.seed_record and self.seed_record.timing and self.best.record.timing):
            return None
        return self.seed_record.timing.median_ms / self.best.record.timing.median_ms

    def payload(self) -> RunSummary:
        """The typed summary the ``kf_run_finished`` hook and the store get."""
        best = self.best
        return RunSummary(
            run_id=self.run_id,
            run_dir=str(self.run_dir),
            stop_reason=self.stop_reason,
            generations=self.generations,
            evaluations=self.evaluations,
            coverage=self.coverage,
            best_label=best.candidate.label if best else None,
            best_params=dict(best.candidate.params) if best else None,
            best_outcome=best.record.outcome.value if best else None,
            best_speedup=best.record.speedup if best else None,
            best_ms=best.record.timing.median_ms if best and best.record.timing else None,
            speedup_over_seed=self.speedup_over_seed,
            exported=str(self.exported) if self.exported else None,
            extra=dict(self.extra),
        )

    def as_dict(self) -> dict[str, Any]:
        """The summary as plain data (the keys of :class:`RunSummary`, ``extra`` left out)."""
        data = self.payload().as_dict()
        data.pop("extra")
        return data
