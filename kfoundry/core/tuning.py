"""The tuning stage: tune one candidate's template parameters on the real device.

:func:`tune_candidate` is what ``kf-run tune`` and the optimize loop call. Each configuration is a
full evaluation (compile, correctness, timing) through the :class:`Evaluator`; anything but a correct
result is reported to the tuner as invalid. Device limits prune the space before anything is
compiled. Every trial can be recorded to a Kernel Tuner cache file, exported as T4, and is written
to the run's store (table ``tuner_trials``, through :mod:`kfoundry.core.db.tuning`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kfoundry.core import warm_start
from kfoundry.core.config import TunerConfig, build_plugin
from kfoundry.core.db import tuning as tuning_db
from kfoundry.core.errors import KfError
from kfoundry.core.models import Candidate, DeviceProfile, EvalRecord, Outcome, TunableSpace, TuningResult
from kfoundry.core.plugins import PluginManager
from kfoundry.core.recorded import CacheWriter, export_t4
from kfoundry.core.space import Config, ParamSpace
from kfoundry.core.tuner import Budget, Invalidity, Measurement, Trial, Tuner, TuneTrace, run_tuner

_INVALIDITY: dict[Outcome, Invalidity] = {
    Outcome.parse_error: "compile",
    Outcome.compile_error: "compile",
    Outcome.runtime_error: "runtime",
    Outcome.timeout: "timeout",
    Outcome.wrong_shape: "correctness",
    Outcome.mismatch: "correctness",
    Outcome.rejected: "constraints",
}


class TuningError(KfError):
    """A candidate cannot be tuned (no tunable parameters, nothing valid on this device)."""


class EvaluatorLike(Protocol):
    """What the tuning stage needs from :class:`kfoundry.core.evaluation.Evaluator`."""

    problem: Any
    store: Any
    run_id: str | None

    @property
    def device(self) -> DeviceProfile: ...

    def evaluate(self, candidate: Candidate) -> EvalRecord: ...


def measurement_of(record: EvalRecord) -> Measurement:
    """An evaluation as the tuner sees it: the median time when correct, else invalid (never slow)."""
    if record.outcome is Outcome.correct and record.timing is not None:
        return Measurement(
            record.timing.median_ms,
            times=list(record.timing.times_ms),
            compile_time_ms=(record.compile_time_s or 0.0) * 1000,
        )
    return Measurement(None, _INVALIDITY.get(record.outcome, "runtime"), record.message)


def merge_spaces(*spaces: TunableSpace | None) -> TunableSpace | None:
    """Later spaces override earlier ones parameter by parameter; restrictions accumulate."""
    params: dict[str, Any] = {}
    restrictions: list[str] = []
    for space in spaces:
        if space is not None:
            params.update(space.params)
            restrictions += [r for r in space.restrictions if r not in restrictions]
    return TunableSpace(params=params, restrictions=restrictions) if params or restrictions else None


def candidate_space(
    candidate: Candidate,
    device: DeviceProfile | None,
    problem_space: TunableSpace | None = None,
    extra: TunableSpace | None = None,
    constants: Mapping[str, Any] | None = None,
    problem_block: Sequence[str] | None = None,
) -> ParamSpace:
    """The space to tune: problem's, then candidate's, then ``extra`` (e.g. from the command line).

    ``candidate.meta`` may name the work-group shape (``block``: expressions per dimension) and the
    local/shared memory a configuration needs (``local_mem``: an expression in bytes); otherwise
    ``problem_block`` (a native task's launch block) or parameter names decide the work-group shape.
    """
    tunable = merge_spaces(problem_space, candidate.space, extra)
    if tunable is None or not tunable.params:
        raise TuningError("the candidate has no template parameters to tune (no space declared)")
    block = candidate.meta.get("block") or problem_block
    return ParamSpace(
        tunable.params,
        tunable.restrictions,
        constants=constants,
        device=device,
        block=list(block) if block is not None else None,
        local_mem_expr=candidate.meta.get("local_mem"),
    )


def native_block(problem: Any) -> list[str] | None:
    """A native task's launch block expressions (the work-group shape), if it declares one."""
    native = getattr(problem, "native", None)
    block = getattr(getattr(getattr(native, "spec", None), "launch", None), "block", None)
    return [str(b) for b in block] if block else None


def default_seeds(
    space: ParamSpace, params: Mapping[str, Any], more: Sequence[Mapping[str, Any]] = ()
) -> list[Config]:
    """Known-good configurations first: the candidate's own values, then ``more``; valid ones only."""
    out: list[Config] = []
    for cand in [params, *more]:
        config = {n: cand[n] for n in space.names if n in cand}
        if len(config) == len(space.names) and space.is_valid(config) and config not in out:
            out.append(config)
    return out


def parallelism(evaluator: Any) -> int:
    """Jobs the evaluator's executor runs at once (1 when it does not say)."""
    return max(1, int(getattr(getattr(evaluator, "executor", None), "parallelism", 1)))


class BatchingTuner(Tuner):
    """Asks the wrapped tuner for up to ``size()`` configurations before their results are told, so
    :class:`Prefetch` evaluates them as one batch; tells pass through. A tuner that repeats itself
    while results are pending simply gets a smaller batch."""

    def __init__(self, inner: Tuner, size: Callable[[], int]) -> None:
        self.inner, self.size = inner, size
        self.name = inner.name  # type: ignore[misc]
        self.queue: list[Config] = []

    def setup(self, space: ParamSpace, rng: Any) -> None:
        super().setup(space, rng)
        self.inner.setup(space, rng)

    def ask(self) -> Config | None:
        if not self.queue:
            keys: set[Any] = set()
            for _ in range(max(1, self.size())):
                config = self.inner.ask()
                if config is None:
                    break
                key = self.space.key(config) if all(n in config for n in self.space.names) else None
                if key is not None and key in keys:
                    break
                keys.add(key)
                self.queue.append(dict(config))
        return self.queue.pop(0) if self.queue else None

    def tell(self, config: Config, value: float | None) -> None:
        self.inner.tell(config, value)


class Prefetch:
    """The objective's evaluations, a batch at a time: when a configuration is asked for, it and the
    other configurations queued with it (seeds, or the batching tuner's queue) that are valid and not
    evaluated yet go to ``evaluate_many`` together (at most ``size()``)."""

    def __init__(
        self, evaluator: Any, candidate: Candidate, space: ParamSpace, size: Callable[[], int]
    ) -> None:
        self.evaluator, self.candidate, self.space, self.size = evaluator, candidate, space, size
        self.done: dict[Any, EvalRecord] = {}

    def _key(self, config: Config) -> Any:
        return self.space.key(config) if all(n in config for n in self.space.names) else None

    def record(self, config: Config, queued: Sequence[Config]) -> EvalRecord:
        key = self._key(config)
        if key in self.done:
            return self.done.pop(key)
        batch, keys = [config], {key}
        for other in queued:
            k = self._key(other)
            if len(batch) >= self.size():
                break
            if k is not None and k not in keys and k not in self.done and self.space.is_valid(other):
                batch.append(other)
                keys.add(k)
        many = getattr(self.evaluator, "evaluate_many", None)
        cands = [self.candidate.with_params({**self.candidate.params, **c}) for c in batch]
        records = (
            many(cands)
            if many is not None and len(cands) > 1
            else [self.evaluator.evaluate(c) for c in cands]
        )
        for c, r in zip(batch[1:], records[1:], strict=True):
            self.done[self._key(c)] = r
        return records[0]


def tune_candidate(
    evaluator: EvaluatorLike,
    candidate: Candidate,
    tuner_config: TunerConfig,
    *,
    space: ParamSpace | None = None,
    seeds: Sequence[Mapping[str, Any]] = (),
    evaluations: int | None = None,
    wall_time_s: float | None = None,
    seed: int = 0,
    record_path: str | Path | None = None,
    t4_path: str | Path | None = None,
    on_trial: Callable[[Trial, EvalRecord], None] | None = None,
    manager: PluginManager | None = None,
    batch: int | None = None,
) -> TuningResult:
    """Tune ``candidate``'s template parameters with the configured tuner; returns the best found.

    The budget is ``evaluations`` (default ``tuner_config.evaluations``) unique configurations and
    ``wall_time_s``; neither is ever overrun. Seeds: the candidate's own parameter values, then
    ``seeds``. ``record_path`` appends every trial to a Kernel Tuner cache file; ``t4_path`` writes
    the trials in T4 format at the end. ``batch`` (default: what the evaluator's executor runs at
    once) configurations are evaluated together: the seeds, then the tuner's asks ahead of its tells.
    """
    problem = evaluator.problem
    device = evaluator.device
    if space is None:
        space = candidate_space(
            candidate,
            device,
            getattr(problem, "space", None),
            constants=getattr(problem, "shapes", None),
            problem_block=native_block(problem),
        )
    space.size  # enumerate now: an empty or oversized space fails before anything is compiled  # noqa: B018
    params_in_force = (
        problem.candidate_params(candidate) if hasattr(problem, "candidate_params") else candidate.params
    )
    warm = warm_start.warm_seeds(evaluator, candidate, space, tuner_config)  # the performance database
    seed_configs = default_seeds(space, params_in_force, [*seeds, *warm])
    budget = Budget(evaluations=evaluations or tuner_config.evaluations, wall_time_s=wall_time_s)
    writer = _writer(record_path, space, device, problem, candidate)
    records: dict[int, EvalRecord] = {}
    tuning_id = secrets.token_hex(6)
    width = batch or parallelism(evaluator)

    def room() -> int:  # never evaluate ahead past the evaluation budget
        left = (budget.evaluations - len(records)) if budget.evaluations is not None else width
        return max(1, min(width, left))

    tuner: Tuner = build_plugin(tuner_config, "tuner", manager)
    if width > 1:
        tuner = BatchingTuner(tuner, room)
    prefetch = Prefetch(evaluator, candidate, space, room)
    pending_seeds = [dict(c) for c in seed_configs]

    def objective(config: Config) -> Measurement:
        if config in pending_seeds:
            del pending_seeds[: pending_seeds.index(config) + 1]
            queued: Sequence[Config] = pending_seeds
        else:
            queued = tuner.queue if isinstance(tuner, BatchingTuner) else []
        record = prefetch.record(config, queued if width > 1 else [])
        records[len(records)] = record
        return measurement_of(record)

    def observe(trial: Trial) -> None:
        record = records[trial.index]
        if writer is not None:
            writer.add_measurement(trial.config, trial.measurement)
        _store_trial(evaluator, tuning_id, record.candidate_hash, tuner_config.name, trial)
        warm_start.remember_trial(evaluator, candidate, trial.config, trial.value)
        if on_trial is not None:
            on_trial(trial, record)

    trace = run_tuner(space, objective, tuner, budget, seeds=seed_configs, seed=seed, on_trial=observe)
    if writer is not None:
        writer.close()
    if t4_path is not None:
        export_t4(t4_path, trace.trials, space.params)
    return tuning_result(trace, tuner_config.name)


def tuning_result(trace: TuneTrace, tuner_name: str) -> TuningResult:
    """A :class:`TuningResult` from a trace."""
    best = trace.best
    return TuningResult(
        best_params=dict(best.config) if best else None,
        best_time_ms=best.value if best else None,
        evaluations=len(trace.trials),
        invalid=sum(1 for t in trace.trials if t.value is None),
        trials=[
            {
                "params": dict(t.config),
                "time_ms": t.value,
                "invalidity": t.measurement.invalidity if t.value is None else "correct",
                "message": t.measurement.message,
                "seeded": t.seeded,
            }
            for t in trace.trials
        ],
        tuner=tuner_name,
    )


def _writer(
    path: str | Path | None, space: ParamSpace, device: DeviceProfile, problem: Any, candidate: Candidate
) -> CacheWriter | None:
    if path is None:
        return None
    return CacheWriter(
        Path(path),
        device_name=device.name,
        kernel_name=candidate.label or getattr(problem, "name", "kernel"),
        problem_size=getattr(problem, "shapes", {}) or [],
        tune_params=space.params,
    )


def _store_trial(
    evaluator: EvaluatorLike, tuning_id: str, candidate_hash: str, tuner: str, trial: Trial
) -> None:
    store = getattr(evaluator, "store", None)
    if store is None:
        return
    tuning_db.insert_trial(
        store, getattr(evaluator, "run_id", None), tuning_id, candidate_hash, tuner, index=trial.index,
        params=trial.config, time_ms=trial.value,
        invalidity=trial.measurement.invalidity if trial.value is None else "correct",
        message=trial.measurement.message, seeded=trial.seeded,
    )  # fmt: skip
