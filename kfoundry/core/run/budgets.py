"""The run's budgets: generations, evaluations, wall time and stagnation, checked before every
evaluation (the LLM token and money caps are the ensemble's ledger; its stop reaches the loop from
planning)."""

from __future__ import annotations

from collections.abc import Callable

from kfoundry.core.config import BudgetConfig
from kfoundry.core.db import loop as loop_db
from kfoundry.core.run.state import LoopState, Stop, StopKind
from kfoundry.core.store import Store


class Budgets:
    """What a run may still spend. ``state`` is the run's live loop state (generation, stagnation,
    tuning trials, elapsed time before a resume); ``clock`` is read once per :attr:`elapsed`."""

    def __init__(
        self, budget: BudgetConfig, store: Store, run_id: str, state: LoopState, clock: Callable[[], float]
    ) -> None:
        self.budget, self.store, self.run_id, self.state, self.clock = budget, store, run_id, state, clock
        self._started = clock() - state.elapsed_s

    @property
    def elapsed(self) -> float:
        """Seconds the run has spent, over all its sessions."""
        return self.clock() - self._started

    @property
    def evaluations(self) -> int:
        """Evaluations done by this run: search proposals plus tuning trials."""
        return loop_db.evaluated_count(self.store, self.run_id) + self.state.tuning_evaluations

    def evaluations_left(self) -> int | None:
        """Evaluations the budget still allows (None: no cap)."""
        b = self.budget.evaluations
        return None if b is None else b - self.evaluations

    def wall_left(self) -> float | None:
        """Seconds left to the wall-time budget, at least one (None: no cap)."""
        b = self.budget.wall_time_s
        return None if b is None else max(1.0, b - self.elapsed)

    def check(self, before_evaluation: bool = False) -> Stop | None:
        """Why the run must stop now (None to continue); ``before_evaluation``: only the budgets that
        forbid the next evaluation (wall time, evaluations), not those judged at a generation's end."""
        b = self.budget
        if b.wall_time_s is not None and self.elapsed >= b.wall_time_s:
            return Stop(StopKind.WALL_TIME, f"wall time budget ({b.wall_time_s:g} s) spent")
        if b.evaluations is not None and self.evaluations >= b.evaluations:
            return Stop(StopKind.EVALUATIONS, f"evaluation budget ({b.evaluations}) spent")
        if before_evaluation:
            return None
        if self.state.generation >= b.generations:
            return Stop(StopKind.GENERATIONS, f"all {b.generations} generations done")
        if b.stagnation_generations is not None and self.state.stagnant >= b.stagnation_generations:
            return Stop(StopKind.STAGNATION, f"no improvement for {self.state.stagnant} generations")
        return None
