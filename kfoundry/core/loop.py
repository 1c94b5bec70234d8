"""The optimize loop: generations of proposals, evaluated, archived, tuned; resumable after a kill.

One generation: the planner (:mod:`kfoundry.core.run.planning`) has the strategy ask and the
generator answer, and stores every proposal *before* it is evaluated; the proposals are evaluated as
one batch (each verdict written as it arrives), then the strategy is told. The loop state (generation
counter, strategy state with its archive, elapsed time) is saved after every step, so ``kf-run resume``
continues exactly where a killed run stopped: stored proposals are not asked for again, finished
evaluations are not repeated; only the ones in flight are run again. The budgets
(:mod:`kfoundry.core.run.budgets`) are checked before every evaluation; the tuning stage
(:mod:`kfoundry.core.run.tuning_stage`) runs between generations and at the end; the best kernel is
exported (:mod:`kfoundry.core.run.export`) to the run folder (:mod:`kfoundry.core.run.folder`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from kfoundry.core import hooks
from kfoundry.core.behaviour.run import check_archive, placed, record_descriptors, space_for_run
from kfoundry.core.config import RunConfig, build_plugin, resolved_config
from kfoundry.core.db import loop as loop_db
from kfoundry.core.db.loop import Row
from kfoundry.core.descriptors import DescriptorExtractor
from kfoundry.core.errors import KfError
from kfoundry.core.generator import Generator
from kfoundry.core.models import EvalRecord, Outcome
from kfoundry.core.payloads import GenerationSummary, resolved_run_config
from kfoundry.core.problem import Problem
from kfoundry.core.run.ahead import PlanAhead, steady_state
from kfoundry.core.run.budgets import Budgets
from kfoundry.core.run.export import export_best
from kfoundry.core.run.folder import (
    RUN_FILE,
    STORE_FILE,
    find_seed_kernel,
    new_run_dir,
    read_run_file,
    run_shape_sets,
    write_run_file,
)
from kfoundry.core.run.planning import Planner, build_generator, propose_together, seed_count
from kfoundry.core.run.progress import Progress, best_text
from kfoundry.core.run.shapes import ShapeSetEvaluator
from kfoundry.core.run.state import (
    LoopError,
    LoopObserver,
    LoopState,
    LoopSummary,
    RunEvaluator,
    Stop,
    StopKind,
)
from kfoundry.core.run.tuning_stage import TuningStage
from kfoundry.core.search import SearchResult, SearchStrategy
from kfoundry.core.store import Store

__all__ = [  # the run's pieces, importable from here as before the split
    "RUN_FILE",
    "STORE_FILE",
    "LoopError",
    "LoopObserver",
    "LoopState",
    "LoopSummary",
    "OptimizeLoop",
    "Row",
    "ShapeSetEvaluator",
    "find_seed_kernel",
    "new_run_dir",
    "propose_together",
    "read_run_file",
    "run_shape_sets",
    "seed_count",
    "write_run_file",
]

log = logging.getLogger(__name__)


class _StopBatch(Exception):
    """Raised from a record callback to end a batch early (a budget ran out)."""


class OptimizeLoop:
    """Runs (or resumes) one optimisation of one problem; see the module docstring."""

    def __init__(
        self,
        config: RunConfig,
        problem: Problem,
        evaluator: RunEvaluator,
        store: Store,
        run_id: str,
        run_dir: Path,
        *,
        generator: Generator | None = None,
        strategy: SearchStrategy | None = None,
        extractor: DescriptorExtractor | None = None,
        observer: LoopObserver | None = None,
        seed_kernel: Path | None = None,
        initial_proposals: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config, self.problem, self.evaluator, self.store = config, problem, evaluator, store
        self.run_id, self.run_dir = run_id, Path(run_dir)
        self.language = evaluator.backend.language
        self.generator = generator or build_generator(config, store, run_id, self.run_dir, self.language)
        self.strategy: SearchStrategy = strategy or build_plugin(config.search, "search")
        self.space = space_for_run(self.strategy, self.language, evaluator, problem, extractor)
        self.extractor = self.space.extractor
        self.observer = observer
        self.seed_kernel = seed_kernel
        saved = loop_db.load_state(store, run_id)
        where = f"loop_state row of run {run_id!r}"
        self.state = store.decode(LoopState, saved, where) if saved else LoopState()
        if self.state.strategy:
            self.strategy.load_state_dict(self.state.strategy)
            check_archive(self.strategy.archive, self.space)
        else:
            self.strategy.setup(self.space.dims, config.seed, self.space.describe())
        self.budgets = Budgets(config.budget, store, run_id, self.state, clock)
        self.planner = Planner(
            config,
            self.generator,
            self.strategy,
            self.space,
            store,
            run_id,
            problem.summary(),
            self.language,
            evaluator.device,
            seed_kernel=seed_kernel,
            initial_proposals=initial_proposals,
        )
        self.tuning = TuningStage(
            config,
            evaluator,
            self.strategy,
            store,
            run_id,
            self.state,
            self.budgets,
            self.save_state,
            self._note,
        )
        self.ahead = PlanAhead(self.planner, config, steady_state(self.strategy))
        self.seed_record: EvalRecord | None = None
        self.progress = Progress(self.strategy.best)

    # -- state and budgets -------------------------------------------------------------------------

    def save_state(self) -> None:
        self.state.elapsed_s = self.elapsed
        loop_db.save_state(self.store, self.run_id, self.state.model_dump_json())

    def rows(self, generation: int | None = None) -> list[Row]:
        """The run's stored proposals (of one generation if given)."""
        return loop_db.proposals(self.store, self.run_id, generation)

    @property
    def elapsed(self) -> float:
        return self.budgets.elapsed

    @property
    def evaluations(self) -> int:
        """Evaluations done by this run: search proposals plus tuning trials."""
        return self.budgets.evaluations

    def _note(self, text: str) -> None:
        if self.observer:
            self.observer.note(self, text)

    # -- the loop ----------------------------------------------------------------------------------

    def run(self) -> LoopSummary:
        """Run until a budget stops it; returns the summary (best kernel, archive coverage, ...).

        An error that stops the run (a model that cannot be reached, a refused key) marks it
        ``failed`` in the store before it propagates; ``kf-run resume`` continues it.
        """
        try:
            return self._run()
        except KfError as exc:
            self._mark_failed(str(exc))
            raise
        finally:
            self.ahead.close()

    def _mark_failed(self, why: str) -> None:
        self.state.status, self.state.stop_reason = "failed", why
        with contextlib.suppress(Exception):  # the error that stopped the run is what must be seen
            self.save_state()
            self.store.save_run(
                self.run_id, self.problem.name, resolved_config(self.config), "failed", {"stop_reason": why}
            )
        hint = f"run marked failed; continue it with: kf-run resume {self.run_dir}"
        if self.observer:
            self.observer.note(self, hint)
        else:
            log.info("%s", hint)

    def _run(self) -> LoopSummary:
        hooks.run_started(self.run_id, resolved_run_config(self.config))
        self.state.status, self.state.stop_reason = "running", ""
        self._recover_seed_record()
        if self.observer:
            self.observer.started(self)
        if self.tuning.due(self.state.generation - 1):
            self.tuning.tune(
                self.state.generation - 1
            )  # a kill during a tuning stage: finish it (from the cache)
        stop = self._generations()
        self.tuning.final(stop)
        self.state.status, self.state.stop_reason = "finished", stop.text
        self.save_state()
        summary = self.summary()
        summary.exported = export_best(summary.best, self.problem.name, self.run_dir)
        best = best_text(summary.best) if summary.best is not None else self.progress.seen(yet=False)
        log.info("run %s stopped: %s; best %s", self.run_id, stop.text, best)
        final = hooks.run_finished(self.run_id, summary.payload())
        summary.extra = dict(final.extra)
        self.store.save_run(
            self.run_id, self.problem.name, resolved_config(self.config), "finished", final.as_dict()
        )
        return summary

    def _generations(self) -> Stop:
        """Plan, evaluate and end generations until something stops the run; returns what did."""
        while not (stop := self.budgets.check()):
            g = self.state.generation
            rows = self.rows(g) or self.planner.plan(g)
            if not rows:  # an LLM ensemble whose budget is spent says why in ``stop_reason``
                why = getattr(self.generator, "stop_reason", "") or "the generator proposed nothing"
                return Stop(StopKind.GENERATOR, why)
            pending = [r for r in rows if r.record is None]
            self.ahead.start(g + 1, self.rows(g + 1), self.budgets.evaluations_left(), len(pending))
            stop = self._evaluate_rows(pending)
            planning_error = self.ahead.join()  # the strategy is told only once its asks are made
            if stop:
                return stop
            self._end_generation(g, rows)
            if planning_error is not None:
                raise planning_error
            if self.planner.llm_stop:
                return self.planner.llm_stop
        return stop

    def _end_generation(self, g: int, rows: list[Row]) -> None:
        self.strategy.tell(self._results(rows))
        best = self.strategy.best
        fit = best.record.fitness if best else -1.0
        self.state.stagnant = 0 if fit > self.state.best_fitness + 1e-9 else self.state.stagnant + 1
        self.state.best_fitness = max(self.state.best_fitness, fit)
        self.state.generation = g + 1
        self.state.strategy = self.strategy.state_dict()
        self.save_state()
        if self.tuning.due(g):
            self.tuning.tune(g)
        loop_db.save_archive(self.store, self.run_id, self.strategy.archive)
        hooks.generation_finished(
            self.run_id,
            g,
            GenerationSummary(
                evaluations=self.evaluations,
                best_speedup=best.record.speedup if best else None,
                coverage=self.strategy.archive.coverage(),
            ),
        )
        log.info(
            "generation %d done: %d evaluations, best %s, %d cells, %.1f s",
            g,
            self.evaluations,
            best_text(best),
            len(self.strategy.archive),
            self.elapsed,
        )
        if self.observer:
            self.observer.generation_done(self, g)

    # -- evaluation --------------------------------------------------------------------------------

    def _evaluate_rows(self, rows: list[Row]) -> Stop | None:
        """Evaluate a generation's pending rows as one batch (the executor runs them concurrently).

        Each record is stored as it arrives, so a kill loses only the jobs in flight; the batch is
        cut to the evaluation budget left. Returns why the run must stop before all were done.
        """
        if stop := self.budgets.check(before_evaluation=True):
            return stop
        left = self.budgets.evaluations_left()
        left = len(rows) if left is None else max(0, left)
        batch: list[Row] = []
        for row in rows:
            if row.candidate is None:  # a parse error costs no evaluation
                self._evaluate(row)
                self._evaluated(row)
            elif len(batch) < left:
                batch.append(row)
        if len(batch) <= 1:
            for row in batch:
                if stop := self.budgets.check(before_evaluation=True):
                    return stop
                self._evaluate(row)
                self._evaluated(row)
        else:

            def arrived(i: int, record: EvalRecord) -> None:
                self._evaluate(batch[i], record)
                self._evaluated(batch[i])
                if self.budgets.check(before_evaluation=True):
                    raise _StopBatch  # a budget is spent: jobs not started yet are cancelled

            with contextlib.suppress(_StopBatch):
                self.evaluator.evaluate_many([r.candidate for r in batch if r.candidate], on_record=arrived)
        return self.budgets.check(before_evaluation=True) if any(r.record is None for r in rows) else None

    def _evaluated(self, row: Row) -> None:
        self.save_state()
        self._log_evaluation(row)
        if self.observer:
            self.observer.evaluated(self, row)

    def _evaluate(self, row: Row, record: EvalRecord | None = None) -> None:
        if row.candidate is None:
            row.record = EvalRecord(
                candidate_hash="",
                eval_key="",
                problem=self.problem.name,
                backend=self.evaluator.backend_name,
                device=self.evaluator.device.key,
                outcome=Outcome.parse_error,
                message=row.parse_error or "no code",
            )
        else:
            record = record or self.evaluator.evaluate(row.candidate)
            record.descriptors = record_descriptors(self.space, row.candidate, row.coords, record)
            row.coords = placed(self.space, row.candidate, row.coords)  # measured traffic may move it
            row.record = record
        loop_db.save_verdict(self.store, self.run_id, row)
        if row.candidate is not None and row.candidate.meta.get("seed") and row.record.is_correct:
            self.seed_record = row.record

    def _results(self, rows: list[Row]) -> list[SearchResult]:
        cells = (0,) * len(self.space.axes)
        return [
            SearchResult(ask=r.ask, candidate=r.candidate, record=r.record, coords=r.coords or cells)
            for r in rows
            if r.candidate is not None and r.record is not None
        ]

    def _log_evaluation(self, row: Row) -> None:
        label, params, verdict = self.progress.evaluated(row)
        of = f"/{self.config.budget.evaluations}" if self.config.budget.evaluations else ""
        log.info(
            "gen %d eval %d%s: %s%s -> %s (best %s)",
            row.generation,
            self.evaluations,
            of,
            label,
            params,
            verdict,
            self.progress.seen(),
        )

    def _recover_seed_record(self) -> None:
        for row in self.rows(0):
            if (
                row.candidate is not None
                and row.candidate.meta.get("seed")
                and row.record
                and row.record.is_correct
            ):
                self.seed_record = row.record

    # -- results -----------------------------------------------------------------------------------

    def summary(self) -> LoopSummary:
        return LoopSummary(
            run_id=self.run_id,
            run_dir=self.run_dir,
            stop_reason=self.state.stop_reason,
            generations=self.state.generation,
            evaluations=self.evaluations,
            best=self.strategy.best,
            seed_record=self.seed_record,
            coverage=self.strategy.archive.coverage(),
        )
