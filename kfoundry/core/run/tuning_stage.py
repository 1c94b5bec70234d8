"""The tuning stage inside a run: every ``tuner.every`` generations (and once at the end) the best
elites with template parameters are tuned on the device; each tuned kernel is judged and told to the
search strategy. A multi-shape run tunes each shape set, warm-started from the sets before it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kfoundry.core.config import RunConfig
from kfoundry.core.db import loop as loop_db
from kfoundry.core.errors import KfError
from kfoundry.core.models import ArchiveCell, Candidate, EvalRecord, TuningResult
from kfoundry.core.run.budgets import Budgets
from kfoundry.core.run.shapes import ShapeSetEvaluator
from kfoundry.core.run.state import LoopState, RunEvaluator, Stop
from kfoundry.core.search import SearchAsk, SearchResult, SearchStrategy
from kfoundry.core.store import Store
from kfoundry.core.tuner import Trial
from kfoundry.core.tuning import tune_candidate

log = logging.getLogger(__name__)

OnTrial = Callable[[Trial, EvalRecord], None]


class TuningStage:
    """Tunes a run's elites; ``save_state`` persists the loop state, ``note`` tells the observer."""

    def __init__(
        self,
        config: RunConfig,
        evaluator: RunEvaluator,
        strategy: SearchStrategy,
        store: Store,
        run_id: str,
        state: LoopState,
        budgets: Budgets,
        save_state: Callable[[], None],
        note: Callable[[str], None],
    ) -> None:
        self.config, self.evaluator, self.strategy, self.store, self.run_id = (
            config,
            evaluator,
            strategy,
            store,
            run_id,
        )
        self.state, self.budgets, self.save_state, self.note = state, budgets, save_state, note

    def due(self, generation: int) -> bool:
        """Whether a tuning stage follows ``generation`` (and the budgets still allow evaluations)."""
        every = self.config.tuner.every
        due = every > 0 and generation >= 0 and (generation + 1) % every == 0
        return due and self.budgets.check(before_evaluation=True) is None

    def final(self, stop: Stop) -> None:
        """The stage at the end of a run, unless tuning is off, the budget is spent or it just ran."""
        if self.config.tuner.every < 0 or stop.device_budget_spent:
            return
        if self.state.generation - 1 in self.state.tuned_generations:
            return  # the last generation's elites were just tuned
        self.tune(self.state.generation)

    def tune(self, generation: int) -> None:
        """Tune the template parameters of the best elites, telling the strategy each tuned kernel."""
        if generation in self.state.tuned_generations:
            return
        elites, seen = [], set()
        for cell in self.strategy.archive.elites(correct_only=True):
            key = (cell.candidate.source, cell.candidate.language)
            if cell.candidate.space and cell.candidate.space.params and key not in seen:
                seen.add(key)
                elites.append(cell)
        for cell in elites[: self.config.tuner.elites]:
            left = self.budgets.evaluations_left()
            if left is not None and left <= 0:
                break
            wall = self.budgets.wall_left()
            budget = (
                self.config.tuner.evaluations if left is None else min(self.config.tuner.evaluations, left)
            )
            log.info("tuning %s (%d evaluations)", cell.candidate.label, budget)
            self.note(f"tuning {cell.candidate.label} ({budget} evaluations)")
            trials = 0
            sets = len(self.evaluator.shape_sets) if isinstance(self.evaluator, ShapeSetEvaluator) else 1

            def count(
                trial: Trial, record: EvalRecord, label: str = cell.candidate.label, of: int = budget * sets
            ) -> None:
                nonlocal trials
                trials += 1
                speed = f" {record.speedup:.2f}x" if record.is_correct and record.speedup else ""
                log.info(
                    "tune %s trial %d/%d %s -> %s%s",
                    label,
                    trials,
                    of,
                    trial.config,
                    record.outcome.value,
                    speed,
                )

            try:
                results = self._tune_cell(cell.candidate, budget, wall, count)
            except KfError as exc:
                log.warning("tuning %s skipped: %s", cell.candidate.label, exc)
                self.note(f"tuning skipped: {exc}")
                continue
            self.state.tuning_evaluations += trials
            for shapes, result in results:
                self._tuned(generation, cell, shapes, result)
        self.state.tuned_generations.append(generation)
        self.state.strategy = self.strategy.state_dict()
        self.save_state()

    def _tune_cell(
        self, candidate: Candidate, budget: int, wall: float | None, on_trial: OnTrial
    ) -> list[tuple[dict[str, Any], TuningResult]]:
        evaluator = self.evaluator
        if not isinstance(evaluator, ShapeSetEvaluator):
            result = tune_candidate(
                evaluator,
                candidate,
                self.config.tuner,
                evaluations=budget,
                wall_time_s=wall,
                seed=self.config.seed,
                on_trial=on_trial,
            )
            return [({}, result)]
        # a multi-shape run tunes each shape set on its own evaluator, warm-started from the best
        # parameters of the sets tuned before it (each set's trials cost one shape's evaluation)
        out: list[tuple[dict[str, Any], TuningResult]] = []
        warm: list[dict[str, Any]] = []
        for shapes, sub in zip(evaluator.shape_sets, evaluator.evaluators, strict=True):
            left = self.budgets.evaluations_left()
            n = budget if left is None else min(budget, left)
            if n <= 0:
                break
            if warm:
                log.info("tuning %s on %s, warm-started from %s", candidate.label, shapes, warm)
            result = tune_candidate(
                sub,
                candidate,
                self.config.tuner,
                seeds=warm,
                evaluations=n,
                wall_time_s=wall,
                seed=self.config.seed,
                on_trial=on_trial,
            )
            if result.best_params and result.best_params not in warm:
                warm.append(dict(result.best_params))
            out.append((dict(shapes), result))
        return out

    def _tuned(
        self, generation: int, cell: ArchiveCell, shapes: dict[str, Any], result: TuningResult
    ) -> None:
        """Store one tuning result and tell the strategy the tuned kernel (judged on every shape set)."""
        on = f" on {shapes}" if shapes else ""
        best_ms = f"{result.best_time_ms:.4f}" if result.best_time_ms is not None else "-"
        log.info(
            "tuned %s%s: %d trials, best %s (%s ms)",
            cell.candidate.label,
            on,
            result.evaluations,
            result.best_params,
            best_ms,
        )
        data = {**result.model_dump(mode="json"), **({"shapes": shapes} if shapes else {})}
        loop_db.save_tuning(self.store, self.run_id, generation, cell.candidate.content_hash, data)
        if not result.best_params:
            return
        tuned = cell.candidate.with_params({**cell.candidate.params, **result.best_params})
        update = {"parent_id": cell.candidate.content_hash, "generator": f"tuner:{result.tuner}"}
        tuned = tuned.model_copy(update=update)
        record = self.evaluator.evaluate(tuned)
        ask = SearchAsk(mode="improve", island=cell.island, extra={"tuned": True})
        self.strategy.tell([SearchResult(ask=ask, candidate=tuned, record=record, coords=tuple(cell.coords))])
