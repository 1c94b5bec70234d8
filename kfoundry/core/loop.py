"""The optimize loop: generations of proposals, evaluated, archived, tuned; resumable after a kill.

One generation: the search strategy asks for ``proposals_per_generation`` requests, the generator
answers each, every proposal is written to the store *before* it is evaluated, then evaluated one at
a time (each verdict written at once), then the strategy is told. The loop state (generation counter,
strategy state with its archive, elapsed time) is saved after every step, so ``kf-run resume``
continues exactly where a killed run stopped: stored proposals are not asked for again, finished
evaluations are not repeated; only the one in flight is run again. Budgets (generations, evaluations,
wall time, stagnation, LLM cost) are checked before every evaluation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from kfoundry.core import hooks
from kfoundry.core.behaviour.run import check_archive, record_descriptors, space_for_run
from kfoundry.core.config import RunConfig, build_plugin, resolved_config
from kfoundry.core.db import loop as loop_db
from kfoundry.core.db.loop import Row
from kfoundry.core.descriptors import DescriptorExtractor
from kfoundry.core.errors import KfError
from kfoundry.core.generator import GenerationRequest, Generator, GeneratorUnsupported
from kfoundry.core.models import Candidate, EvalRecord, Outcome, Proposal
from kfoundry.core.search import SearchAsk, SearchResult, SearchStrategy
from kfoundry.core.store import Store

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
STORE_FILE = "kfoundry.db"

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


class LoopObserver(Protocol):
    """What the loop reports while it runs (the CLI draws a progress bar from it)."""

    def started(self, loop: OptimizeLoop) -> None: ...

    def evaluated(self, loop: OptimizeLoop, row: Row) -> None: ...

    def generation_done(self, loop: OptimizeLoop, generation: int) -> None: ...

    def note(self, loop: OptimizeLoop, text: str) -> None: ...


@dataclass
class LoopSummary:
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

    def as_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "stop_reason": self.stop_reason,
            "generations": self.generations,
            "evaluations": self.evaluations,
            "coverage": self.coverage,
            "best_label": best.candidate.label if best else None,
            "best_params": best.candidate.params if best else None,
            "best_outcome": best.record.outcome.value if best else None,
            "best_speedup": best.record.speedup if best else None,
            "best_ms": best.record.timing.median_ms if best and best.record.timing else None,
            "speedup_over_seed": self.speedup_over_seed,
            "exported": str(self.exported) if self.exported else None,
        }


class _StopBatch(Exception):
    """Raised from a record callback to end a batch early (a budget ran out)."""


class ShapeSetEvaluator:
    """Evaluates each candidate on several shape sets, one evaluator per set, and aggregates.

    A candidate is correct when it is correct on every set (evaluation stops at the first set it
    fails, whose record is returned); its speedup is the geometric mean of the sets' speedups and
    its timing the first set's. Each set's verdict is kept in ``record.resources["per_shape"]``.
    """

    def __init__(self, evaluators: list[Any], shape_sets: list[dict[str, int | float]]) -> None:
        if not evaluators or len(evaluators) != len(shape_sets):
            raise LoopError("a multi-shape run needs one evaluator per shape set")
        self.evaluators, self.shape_sets = evaluators, shape_sets
        first = evaluators[0]
        self.problem, self.backend, self.config = first.problem, first.backend, first.config
        self.store, self.run_id = getattr(first, "store", None), getattr(first, "run_id", None)

    @property
    def device(self) -> Any:
        return self.evaluators[0].device

    @property
    def backend_name(self) -> str:
        return str(self.evaluators[0].backend_name)

    def evaluate(self, candidate: Candidate) -> EvalRecord:
        return self.evaluate_many([candidate])[0]

    def evaluate_many(
        self, candidates: list[Candidate], on_record: Callable[[int, EvalRecord], None] | None = None
    ) -> list[EvalRecord]:
        """Each shape set's evaluator gets every candidate still correct at once (concurrently where
        its executor allows); ``on_record(index, record)`` as each candidate's verdict is final."""
        per: list[list[EvalRecord]] = [[] for _ in candidates]
        out: list[EvalRecord | None] = [None] * len(candidates)
        alive = list(range(len(candidates)))
        for n, evaluator in enumerate(self.evaluators):
            last = n == len(self.evaluators) - 1

            def arrived(j: int, record: EvalRecord, ids: list[int] = alive, last: bool = last) -> None:
                i = ids[j]
                per[i].append(record)
                if last or not record.is_correct:
                    out[i] = final = self._aggregate(per[i])
                    if on_record is not None:
                        on_record(i, final)

            many = getattr(evaluator, "evaluate_many", None)
            if many is not None:
                many([candidates[i] for i in alive], on_record=arrived)
            else:
                for j, i in enumerate(alive):
                    arrived(j, evaluator.evaluate(candidates[i]))
            alive = [i for i in alive if out[i] is None]
        return [r for r in out if r is not None]

    def _aggregate(self, records: list[EvalRecord]) -> EvalRecord:
        per_shape = [
            {"shapes": dict(s), "outcome": r.outcome.value, "speedup": r.speedup, "eval_key": r.eval_key,
             "median_ms": r.timing.median_ms if r.timing else None,
             "reference_ms": r.reference_timing.median_ms if r.reference_timing else None}
            for s, r in zip(self.shape_sets, records, strict=False)
        ]
        base = records[-1] if not records[-1].is_correct else records[0]
        speedups = [r.speedup for r in records]
        update: dict[str, Any] = {"resources": {**base.resources, "per_shape": per_shape}}
        if base.is_correct and all(x is not None and x > 0 for x in speedups):
            update["speedup"] = math.exp(sum(math.log(x) for x in speedups if x) / len(speedups))
            update["roofline_flag"] = any(r.roofline_flag for r in records)
        elif not base.is_correct and len(self.shape_sets) > 1:
            update["message"] = f"on shape set {self.shape_sets[len(records) - 1]}: {base.message}"
        return base.model_copy(update=update)


def propose_together(
    generator: Generator, requests: list[GenerationRequest], limit: int, *, seeds: bool = False
) -> list[list[Proposal] | KfError]:
    """``generator.propose`` (``seeds``: ``generator.seeds``) for every request, ``limit`` at a time
    (threads: the calls wait on the network); per request its proposals or the :class:`KfError` it
    raised, in request order."""

    def one(request: GenerationRequest) -> list[Proposal] | KfError:
        try:
            return generator.seeds(request) if seeds else generator.propose(request)
        except KfError as exc:
            return exc

    if limit <= 1 or len(requests) <= 1:
        return [one(r) for r in requests]
    with ThreadPoolExecutor(max_workers=min(len(requests), limit)) as pool:
        return list(pool.map(one, requests))


def build_generator(config: RunConfig, store: Store, run_id: str, run_dir: Path, language: str) -> Generator:
    """The run's generator: the ensemble over ``config.llms`` (the single member when it is alone)."""
    try:
        from kfoundry.core.ensemble import build_ensemble
    except ImportError:  # pragma: no cover - the ensemble module ships with kfoundry
        return build_plugin(config.llms[0], "llm")
    if len(config.llms) == 1 and config.llms[0].name == "offline":
        return build_plugin(config.llms[0], "llm")
    return build_ensemble(config, store, run_id=run_id, run_dir=run_dir, language=language)


def find_seed_kernel(problem_path: Path, language: str) -> Path | None:
    """The problem's naive seed kernel by the examples' convention: ``seeds/<stem>_<language>.py``."""
    path = problem_path.parent / "seeds" / f"{problem_path.stem}_{language}.py"
    return path if path.is_file() else None


class OptimizeLoop:
    """Runs (or resumes) one optimisation of one problem; see the module docstring."""

    def __init__(
        self,
        config: RunConfig,
        problem: Any,
        evaluator: Any,
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
        self.strategy = strategy or build_plugin(config.search, "search")
        self.space = space_for_run(self.strategy, self.language, evaluator, problem, extractor)
        self.extractor = self.space.extractor
        self.observer = observer
        self.seed_kernel = seed_kernel
        #: Generator seeds evaluated in generation 0 (default: :func:`seed_count`).
        self.initial_proposals = initial_proposals
        self.clock = clock
        self.state = self._load_state()
        if self.state.strategy:
            self.strategy.load_state_dict(self.state.strategy)
            check_archive(self.strategy.archive, self.space)
        else:
            self.strategy.setup(self.space.dims, config.seed, self.space.describe())
        self._summary = problem.summary()
        self._started = self.clock() - self.state.elapsed_s
        self.seed_record: EvalRecord | None = None
        self._llm_stop = ""
        best = self.strategy.best
        #: Fastest correct evaluation logged so far: (speedup, label).
        self._best_seen = (best.record.speedup or 0.0, best.candidate.label) if best and best.record.is_correct else (0.0, "")

    # -- persistence -------------------------------------------------------------------------------

    def _load_state(self) -> LoopState:
        data = loop_db.load_state(self.store, self.run_id)
        return self.store.decode(LoopState, data, f"loop_state row of run {self.run_id!r}") if data else LoopState()

    def save_state(self) -> None:
        self.state.elapsed_s = self.elapsed
        loop_db.save_state(self.store, self.run_id, self.state.model_dump_json())

    def rows(self, generation: int | None = None) -> list[Row]:
        return loop_db.proposals(self.store, self.run_id, generation)

    # -- budgets -----------------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return self.clock() - self._started

    @property
    def evaluations(self) -> int:
        """Evaluations done by this run: search proposals plus tuning trials."""
        return loop_db.evaluated_count(self.store, self.run_id) + self.state.tuning_evaluations

    def stop_reason(self, before_evaluation: bool = False) -> str:
        """Why the run must stop now ("" to continue)."""
        b = self.config.budget
        if b.wall_time_s is not None and self.elapsed >= b.wall_time_s:
            return f"wall time budget ({b.wall_time_s:g} s) spent"
        if b.evaluations is not None and self.evaluations >= b.evaluations:
            return f"evaluation budget ({b.evaluations}) spent"
        if before_evaluation:
            return ""
        if self.state.generation >= b.generations:
            return f"all {b.generations} generations done"
        if b.stagnation_generations is not None and self.state.stagnant >= b.stagnation_generations:
            return f"no improvement for {self.state.stagnant} generations"
        return ""

    # -- planning ----------------------------------------------------------------------------------

    def _request(self, ask: SearchAsk, generation: int, index: int, avoid: set[str]) -> GenerationRequest:
        return GenerationRequest(
            problem=self._summary, language=self.language, device=self.evaluator.device, mode=ask.mode,
            parent=ask.parent, inspirations=ask.inspirations, target_cell=ask.target_cell, n=1,
            seed=self.config.seed, generation=generation,
            extra={**ask.extra, "index": index, "avoid": sorted(avoid), "island": ask.island,
                   "descriptors": self.space.describe()},
        )

    def _cell(self, candidate: Candidate | None) -> tuple[int, ...] | None:
        return self.space.cell(candidate) if candidate is not None else None

    def plan(self, generation: int) -> list[Row]:
        """Ask the strategy and the generator for this generation's proposals and store them."""
        avoid = loop_db.proposed_hashes(self.store, self.run_id)
        n = self.config.budget.proposals_per_generation
        pairs: list[tuple[SearchAsk, Proposal]] = []
        try:
            if generation == 0:
                pairs = self._seed_proposals(n, avoid)
            elif self._concurrency > 1:
                asks = list(self.strategy.ask(n))
                pairs = self._propose_concurrently([(a, self._request(a, generation, i, avoid)) for i, a in enumerate(asks)])
            else:
                for i, ask in enumerate(self.strategy.ask(n)):
                    for p in self.generator.propose(self._request(ask, generation, i, avoid)):
                        pairs.append((ask, p))
                        if p.candidate is not None:
                            avoid.add(p.candidate.content_hash)
        except GeneratorUnsupported as exc:
            raise LoopError(str(exc)) from None
        except KfError as exc:
            if type(exc).__name__ != "LLMBudgetExhausted" or not pairs:
                raise
            self._llm_stop = f"LLM budget spent ({exc})"  # keep what was proposed before the cap
        rows = [
            Row(generation=generation, idx=i, ask=ask, candidate=p.candidate, generator=p.generator,
                rationale=p.rationale, parse_error=p.parse_error, coords=self._cell(p.candidate))
            for i, (ask, p) in enumerate(pairs)
        ]
        loop_db.insert_proposals(self.store, self.run_id, rows)
        return rows

    @property
    def _concurrency(self) -> int:
        """Generator requests sent at once (the generator's own limit; 1 for non-LLM generators)."""
        return max(1, int(getattr(self.generator, "concurrency", 1)))

    def _propose_concurrently(
        self, requests: list[tuple[SearchAsk, GenerationRequest]], seeds: bool = False
    ) -> list[tuple[SearchAsk, Proposal]]:
        """A generation's requests sent together (the providers cap calls in flight); proposals in
        request order. A spent LLM budget keeps what the other requests brought back."""
        answers = propose_together(self.generator, [r for _, r in requests], self._concurrency, seeds=seeds)
        pairs = [(ask, p) for (ask, _), got in zip(requests, answers, strict=True) if isinstance(got, list) for p in got]
        errors = [e for e in answers if isinstance(e, KfError)]
        fatal = [e for e in errors if type(e).__name__ != "LLMBudgetExhausted"]
        if fatal or (errors and not pairs):
            raise (fatal or errors)[0]
        if errors:
            self._llm_stop = f"LLM budget spent ({errors[0]})"
        return pairs

    def _seed_proposals(self, n: int, avoid: set[str]) -> list[tuple[SearchAsk, Proposal]]:
        pairs: list[tuple[SearchAsk, Proposal]] = []
        ask = SearchAsk(mode="create", extra={"seed": True})
        if self.seed_kernel is not None:
            from kfoundry.core.commands.eval import read_candidate

            cand = read_candidate(self.seed_kernel).model_copy(update={"generator": "seed", "meta": {"seed": True}})
            pairs.append((ask, Proposal(candidate=cand, generator="seed", rationale=f"naive seed {self.seed_kernel.name}")))
        request = self._request(ask, 0, 0, avoid).model_copy(update={"n": self.initial_proposals or seed_count(self.config)})
        if self._concurrency > 1 and request.n > 1:  # one request per seed, sent together
            each = [request.model_copy(update={"n": 1, "extra": {**request.extra, "index": i}}) for i in range(request.n)]
            return pairs + self._propose_concurrently([(ask, r) for r in each], seeds=True)
        pairs += [(ask, p) for p in self.generator.seeds(request)]
        return pairs

    # -- evaluation --------------------------------------------------------------------------------

    def _evaluate_rows(self, rows: list[Row]) -> str:
        """Evaluate a generation's pending rows as one batch (the executor runs them concurrently).

        Each record is stored as it arrives, so a kill loses only the jobs in flight; the batch is
        cut to the evaluation budget left. Returns why the run must stop before all were done ("").
        """
        if reason := self.stop_reason(before_evaluation=True):
            return reason
        budget = self.config.budget.evaluations
        left = len(rows) if budget is None else max(0, budget - self.evaluations)
        batch: list[Row] = []
        for row in rows:
            if row.candidate is None:  # a parse error costs no evaluation
                self._evaluate(row)
                self._evaluated(row)
            elif len(batch) < left:
                batch.append(row)
        many = getattr(self.evaluator, "evaluate_many", None)
        if many is None or len(batch) <= 1:
            for row in batch:
                if reason := self.stop_reason(before_evaluation=True):
                    return reason
                self._evaluate(row)
                self._evaluated(row)
        else:
            def arrived(i: int, record: EvalRecord) -> None:
                self._evaluate(batch[i], record)
                self._evaluated(batch[i])
                if self.stop_reason(before_evaluation=True):
                    raise _StopBatch  # a budget is spent: jobs not started yet are cancelled

            with contextlib.suppress(_StopBatch):
                many([r.candidate for r in batch], on_record=arrived)
        return self.stop_reason(before_evaluation=True) if any(r.record is None for r in rows) else ""

    def _evaluated(self, row: Row) -> None:
        self.save_state()
        self._log_evaluation(row)
        if self.observer:
            self.observer.evaluated(self, row)

    def _evaluate(self, row: Row, record: EvalRecord | None = None) -> None:
        if row.candidate is None:
            row.record = EvalRecord(
                candidate_hash="", eval_key="", problem=self.problem.name, backend=self.evaluator.backend_name,
                device=self.evaluator.device.key, outcome=Outcome.parse_error, message=row.parse_error or "no code",
            )
        else:
            record = record or self.evaluator.evaluate(row.candidate)
            record.descriptors = record_descriptors(self.space, row.candidate, row.coords, record)
            row.record = record
        loop_db.save_verdict(self.store, self.run_id, row)
        if row.candidate is not None and row.candidate.meta.get("seed") and row.record.is_correct:
            self.seed_record = row.record

    def _results(self, rows: list[Row]) -> list[SearchResult]:
        return [
            SearchResult(ask=r.ask, candidate=r.candidate, record=r.record, coords=r.coords or (0,) * len(self.space.axes))
            for r in rows if r.candidate is not None and r.record is not None
        ]

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

    def _mark_failed(self, why: str) -> None:
        self.state.status, self.state.stop_reason = "failed", why
        with contextlib.suppress(Exception):  # the error that stopped the run is what must be seen
            self.save_state()
            self.store.save_run(self.run_id, self.problem.name, resolved_config(self.config), "failed",
                                {"stop_reason": why})
        hint = f"run marked failed; continue it with: kf-run resume {self.run_dir}"
        if self.observer:
            self.observer.note(self, hint)
        else:
            log.info("%s", hint)

    def _run(self) -> LoopSummary:
        hooks.run_started(self.run_id, resolved_config(self.config))
        self.state.status, self.state.stop_reason = "running", ""
        self._recover_seed_record()
        if self.observer:
            self.observer.started(self)
        last, every = self.state.generation - 1, self.config.tuner.every
        if every > 0 and last >= 0 and (last + 1) % every == 0 and not self.stop_reason(before_evaluation=True):
            self._tune(last)  # a kill during a tuning stage: finish it (done trials come from the cache)
        reason = ""
        while not (reason := self.stop_reason()):
            g = self.state.generation
            rows = self.rows(g) or self.plan(g)
            if not rows:  # an LLM ensemble whose budget is spent says why in ``stop_reason``
                reason = getattr(self.generator, "stop_reason", "") or "the generator proposed nothing"
                break
            reason = self._evaluate_rows([r for r in rows if r.record is None])
            if reason:
                break
            self._end_generation(g, rows)
            if self._llm_stop:
                reason = self._llm_stop
                break
        self._final_tuning(reason)
        self.state.status = "finished"
        self.state.stop_reason = reason
        self.save_state()
        summary = self.summary()
        summary.exported = self.export_best()
        seen = f"{self._best_seen[0]:.2f}x ({self._best_seen[1]})" if self._best_seen[1] else "none correct"
        log.info("run %s stopped: %s; best %s", self.run_id, reason,
                 _best_text(summary.best) if summary.best is not None else seen)
        hooks.run_finished(self.run_id, summary.as_dict())
        self.store.save_run(self.run_id, self.problem.name, resolved_config(self.config), "finished", summary.as_dict())
        return summary

    def _end_generation(self, g: int, rows: list[Row]) -> None:
        self.strategy.tell(self._results(rows))
        best = self.strategy.best
        fit = best.record.fitness if best else -1.0
        self.state.stagnant = 0 if fit > self.state.best_fitness + 1e-9 else self.state.stagnant + 1
        self.state.best_fitness = max(self.state.best_fitness, fit)
        self.state.generation = g + 1
        self.state.strategy = self.strategy.state_dict()
        self.save_state()
        every = self.config.tuner.every
        if every > 0 and (g + 1) % every == 0 and not self.stop_reason(before_evaluation=True):
            self._tune(g)
        loop_db.save_archive(self.store, self.run_id, self.strategy.archive)
        hooks.generation_finished(self.run_id, g, {
            "evaluations": self.evaluations, "best_speedup": best.record.speedup if best else None,
            "coverage": self.strategy.archive.coverage(),
        })
        log.info("generation %d done: %d evaluations, best %s, %d cells, %.1f s", g, self.evaluations,
                 _best_text(best), len(self.strategy.archive), self.elapsed)
        if self.observer:
            self.observer.generation_done(self, g)

    def _log_evaluation(self, row: Row) -> None:
        rec = row.record
        label = row.candidate.label if row.candidate else "(no code)"
        params = f" {row.candidate.params}" if row.candidate and row.candidate.params else ""
        verdict = rec.outcome.value if rec else "?"
        if rec is not None and rec.is_correct and rec.speedup:
            ms = f" {rec.timing.median_ms:.4f} ms" if rec.timing else ""
            verdict = f"{verdict} {rec.speedup:.2f}x{ms}"
        budget = self.config.budget.evaluations
        of = f"/{budget}" if budget else ""
        if rec is not None and rec.is_correct and (rec.speedup or 0) > self._best_seen[0]:
            self._best_seen = (rec.speedup or 0.0, label)
        best = f"{self._best_seen[0]:.2f}x ({self._best_seen[1]})" if self._best_seen[1] else "none correct yet"
        log.info("gen %d eval %d%s: %s%s -> %s%s (best %s)", row.generation, self.evaluations, of, label, params,
                 verdict, " (cached)" if rec is not None and rec.cached else "", best)

    def _recover_seed_record(self) -> None:
        for row in self.rows(0):
            if row.candidate is not None and row.candidate.meta.get("seed") and row.record and row.record.is_correct:
                self.seed_record = row.record

    # -- tuning ------------------------------------------------------------------------------------

    def _final_tuning(self, reason: str) -> None:
        if self.config.tuner.every < 0 or "wall time" in reason or "evaluation budget" in reason:
            return
        if self.state.generation - 1 in self.state.tuned_generations:
            return  # the last generation's elites were just tuned
        self._tune(self.state.generation)

    def _tune(self, generation: int) -> None:
        """Tune the template parameters of the best elites (the tuning stage), telling the strategy."""
        if generation in self.state.tuned_generations:
            return
        try:
            from kfoundry.core.tuning import tune_candidate
        except ImportError:  # pragma: no cover - the tuning stage ships with kfoundry
            return
        elites, seen = [], set()
        for cell in self.strategy.archive.elites(correct_only=True):
            key = (cell.candidate.source, cell.candidate.language)
            if cell.candidate.space and cell.candidate.space.params and key not in seen:
                seen.add(key)
                elites.append(cell)
        for cell in elites[: self.config.tuner.elites]:
            b = self.config.budget
            left = None if b.evaluations is None else b.evaluations - self.evaluations
            if left is not None and left <= 0:
                break
            wall = None if b.wall_time_s is None else max(1.0, b.wall_time_s - self.elapsed)
            budget = min(self.config.tuner.evaluations, left) if left is not None else self.config.tuner.evaluations
            log.info("tuning %s (%d evaluations)", cell.candidate.label, budget)
            if self.observer:
                self.observer.note(self, f"tuning {cell.candidate.label} ({budget} evaluations)")
            trials = 0

            sets = len(getattr(self.evaluator, "shape_sets", None) or [None])  # a multi-shape run tunes each set

            def count(trial: Any, record: EvalRecord, label: str = cell.candidate.label,
                      of: int = budget * sets) -> None:
                nonlocal trials
                trials += 1
                speed = f" {record.speedup:.2f}x" if record.is_correct and record.speedup else ""
                log.info("tune %s trial %d/%d %s -> %s%s", label, trials, of, getattr(trial, "config", trial),
                         record.outcome.value, speed)

            try:
                if isinstance(self.evaluator, ShapeSetEvaluator):
                    results = self._tune_per_shape(cell.candidate, budget, wall, count)
                else:
                    results = [({}, tune_candidate(self.evaluator, cell.candidate, self.config.tuner,
                                                   evaluations=budget, wall_time_s=wall, seed=self.config.seed,
                                                   on_trial=count))]
            except KfError as exc:
                log.warning("tuning %s skipped: %s", cell.candidate.label, exc)
                if self.observer:
                    self.observer.note(self, f"tuning skipped: {exc}")
                continue
            self.state.tuning_evaluations += trials
            for shapes, result in results:
                self._tuned(generation, cell, shapes, result)
        self.state.tuned_generations.append(generation)
        self.state.strategy = self.strategy.state_dict()
        self.save_state()

    def _tune_per_shape(self, candidate: Candidate, budget: int, wall: float | None,
                        on_trial: Callable[[Any, EvalRecord], None]) -> list[tuple[dict[str, Any], Any]]:
        """A multi-shape run tunes each shape set on its own evaluator, warm-started from the best
        parameters of the sets tuned before it (each set's trials cost one shape's evaluation)."""
        from kfoundry.core.tuning import tune_candidate

        evaluator = self.evaluator
        assert isinstance(evaluator, ShapeSetEvaluator)
        out: list[tuple[dict[str, Any], Any]] = []
        warm: list[dict[str, Any]] = []
        for shapes, sub in zip(evaluator.shape_sets, evaluator.evaluators, strict=True):
            left = self.config.budget.evaluations
            n = budget if left is None else min(budget, left - self.evaluations)
            if n <= 0:
                break
            if warm:
                log.info("tuning %s on %s, warm-started from %s", candidate.label, shapes, warm)
            result = tune_candidate(sub, candidate, self.config.tuner, seeds=warm, evaluations=n, wall_time_s=wall,
                                    seed=self.config.seed, on_trial=on_trial)
            if result.best_params and result.best_params not in warm:
                warm.append(dict(result.best_params))
            out.append((dict(shapes), result))
        return out

    def _tuned(self, generation: int, cell: Any, shapes: dict[str, Any], result: Any) -> None:
        """Store one tuning result and tell the strategy the tuned kernel (judged on every shape set)."""
        on = f" on {shapes}" if shapes else ""
        log.info("tuned %s%s: %d trials, best %s (%s ms)", cell.candidate.label, on, result.evaluations,
                 result.best_params, f"{result.best_time_ms:.4f}" if result.best_time_ms is not None else "-")
        data = {**result.model_dump(mode="json"), **({"shapes": shapes} if shapes else {})}
        loop_db.save_tuning(self.store, self.run_id, generation, cell.candidate.content_hash, data)
        if not result.best_params:
            return
        tuned = cell.candidate.with_params({**cell.candidate.params, **result.best_params})
        tuned = tuned.model_copy(update={"parent_id": cell.candidate.content_hash, "generator": f"tuner:{result.tuner}"})
        record = self.evaluator.evaluate(tuned)
        self.strategy.tell([SearchResult(ask=SearchAsk(mode="improve", island=cell.island, extra={"tuned": True}),
                                         candidate=tuned, record=record, coords=tuple(cell.coords))])

    # -- results -----------------------------------------------------------------------------------

    def summary(self) -> LoopSummary:
        return LoopSummary(
            run_id=self.run_id, run_dir=self.run_dir, stop_reason=self.state.stop_reason,
            generations=self.state.generation, evaluations=self.evaluations, best=self.strategy.best,
            seed_record=self.seed_record, coverage=self.strategy.archive.coverage(),
        )

    def export_best(self) -> Path | None:
        """Write the best correct kernel to the run folder as a standalone ``ModelNew`` file."""
        best = self.strategy.best
        if best is None or not best.record.is_correct:
            return None
        suffix = ".py" if best.candidate.kind == "kernelbench" else {"opencl": ".cl", "cuda": ".cu"}.get(
            best.candidate.language, ".txt")
        path = self.run_dir / f"best_{self.problem.name}_{best.candidate.language}{suffix}"
        header = ""
        if best.candidate.kind == "kernelbench":
            speed = f"{best.record.speedup:.2f}x" if best.record.speedup else "n/a"
            header = (f"# kfoundry best kernel for {self.problem.name}: {best.candidate.label}, speedup {speed} "
                      f"over the reference on {best.record.device}\nPARAMS = {best.candidate.params!r}\n\n")
        path.write_text(header + best.candidate.source)
        (self.run_dir / "best.json").write_text(json.dumps({
            "candidate": best.candidate.model_dump(mode="json"), "record": best.record.model_dump(mode="json"),
        }, indent=2))
        return path


def _best_text(best: SearchResult | None) -> str:
    if best is None or not best.record.is_correct:
        return "none correct yet"
    return f"{best.record.speedup or 0:.2f}x ({best.candidate.label})"


def seed_count(config: RunConfig) -> int:
    """Proposals generation 0 asks for: ``proposals_per_generation`` when a language model is among the
    generators (each is a paid call), at least 8 when only the offline generator proposes (free seeds)."""
    n = config.budget.proposals_per_generation
    return n if any(choice.name != "offline" for choice in config.llms) else max(n, 8)


# -- run folders -------------------------------------------------------------------------------------


def new_run_dir(config: RunConfig, problem_name: str) -> tuple[str, Path]:
    """A fresh run id and folder under ``config.output_dir``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(config.output_dir) / f"{problem_name}-{stamp}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    path.mkdir(parents=True)
    return path.name, path


def write_run_file(run_dir: Path, run_id: str, problem_path: Path, shapes: dict[str, Any], config: RunConfig,
                   seed_kernel: Path | None, shape_sets: list[dict[str, Any]] | None = None) -> None:
    """What ``kf-run resume`` needs to rebuild the run (``shape_sets``: a multi-shape run's sets)."""
    data: dict[str, Any] = {
        "run_id": run_id, "problem": str(problem_path.resolve()), "shapes": shapes,
        "config": config.model_dump(mode="json"), "seed_kernel": str(seed_kernel.resolve()) if seed_kernel else None,
    }
    if shape_sets and len(shape_sets) > 1:
        data["shape_sets"] = shape_sets
    (run_dir / RUN_FILE).write_text(json.dumps(data, indent=2))


def run_shape_sets(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The shape sets of a run read from its ``run.json`` (one set for a single-shape run)."""
    sets = info.get("shape_sets")
    return [dict(s) for s in sets] if sets else [dict(info.get("shapes") or {})]


def read_run_file(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        raise LoopError(f"{run_dir}: not a kfoundry run folder (no {RUN_FILE})")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise LoopError(f"{path}: unreadable run file: {exc}") from None
