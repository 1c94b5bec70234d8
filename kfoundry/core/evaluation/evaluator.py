"""The :class:`Evaluator`: candidate in, trustworthy :class:`EvalRecord` out.

Static checks (built-in and every plugin's ``kf_static_checks``) run here; compile, correctness and
timing run in a sandboxed worker through the configured executor plugin. Results are cached in the
store by content hash of (candidate source/params, problem, backend, device, toolchain, tolerances).
Speedup is against the reference timed by the same harness on the same device; the roofline
fraction uses the device's peak bandwidth / fp32 rate where known, and a time under the roofline or
a speedup above ``evaluation.flag_speedup_above`` sets ``roofline_flag`` for review.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from kfoundry.core import hooks
from kfoundry.core.backend import Backend
from kfoundry.core.config import RunConfig, build_plugin
from kfoundry.core.errors import BackendUnavailable, KfError
from kfoundry.core.evaluation.executor import Executor
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.evaluation.static import check_source
from kfoundry.core.models import Candidate, DeviceProfile, EvalRecord, Outcome, TimingStats, stable_hash
from kfoundry.core.peaks import roofline_fraction
from kfoundry.core.plugins import PluginKind, get_plugin_manager
from kfoundry.core.problem import Problem
from kfoundry.core.store import Store

#: A flagged kernel's second (differential) measurement may be at most this many times slower.
REMEASURE_TOLERANCE = 1.3


class EvaluationError(KfError):
    """The evaluation itself cannot proceed (for example: the reference fails on this device)."""


def _entry_point_of(kind: PluginKind, name: str) -> str | None:
    """The entry point that registered plugin ``name`` (None if it was registered in-process)."""
    plugin = get_plugin_manager().get(kind, name).plugin
    names = {ep.name for ep in md.entry_points(group="kfoundry")}
    return plugin if plugin in names else None


def _environment_failure(result: JobResult) -> bool:
    """A failure of the machinery (sandbox server died, worker setup failed), not of the candidate."""
    return result.outcome is Outcome.runtime_error and (
        result.message.startswith("setup:") or "the sandbox server died" in result.message
    )


_warned: set[str] = set()


def _warn_unprotected(result: JobResult) -> None:
    """One line per process (stderr) for each sandbox protection that was not in force."""
    missing = sorted(k for k, v in result.sandbox.items() if not v and k not in _warned)
    if not missing:
        return
    _warned.update(missing)
    why = "; ".join(result.sandbox_notes)[:300]
    print(
        f"kfoundry: warning: sandbox protection not in force here: {', '.join(missing)}"
        + (f" ({why})" if why else ""),
        file=sys.stderr,
    )


class Evaluator:
    """Evaluates candidates for one problem on one backend device (see module docstring)."""

    def __init__(
        self,
        problem: Problem,
        config: RunConfig,
        store: Store | None = None,
        run_id: str | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.problem = problem
        self.config = config
        self.store = store
        self.run_id = run_id
        self.backend: Backend = build_plugin(config.backend, "backend")
        caps = self.backend.capabilities()
        if not caps.can_run:
            raise BackendUnavailable(f"backend {self.backend.name} cannot run kernels here: {caps.reason}")
        self._device = self.backend.select_device(config.backend.device)
        problem.check_size(config.problem.max_bytes, self._device.global_mem_bytes)  # before any allocation
        self.toolchain = self.backend.toolchain_version()
        self.executor: Executor = executor or build_plugin(config.executor, "executor")
        digest = hashlib.sha256(self._device.key.encode()).hexdigest()[:12]
        self.lock_path = str(Path(tempfile.gettempdir()) / f"kfoundry-bench-{digest}.lock")
        self._reference: TimingStats | None = None
        self._reference_lock = threading.Lock()
        self._backend_plugin = _entry_point_of("backend", config.backend.name)

    # -- properties -----------------------------------------------------------------------------

    @property
    def device(self) -> DeviceProfile:
        return self._device

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def eval_key(self, candidate: Candidate) -> str:
        """Cache key: candidate content, problem, backend, device, toolchain and tolerances."""
        ev = self.config.evaluation
        return stable_hash(
            candidate.content_hash,
            self.problem.key,
            self.backend.name,
            self._device.key,
            self.toolchain,
            ev.trials,
            ev.atol,
            ev.rtol,
        )

    # -- jobs -----------------------------------------------------------------------------------

    def _job(self, kind: str, candidate: Candidate | None = None) -> EvalJob:
        return EvalJob(
            kind=kind,
            problem_path=str(self.problem.path.resolve()),
            shapes=dict(self.problem.shapes),
            candidate=candidate,
            backend=self.backend.name,
            backend_options=dict(self.config.backend.options),
            backend_plugin=self._backend_plugin,
            device=self._device.index,
            device_profile=self._device,  # a compile job elsewhere compiles for it
            evaluation=self.config.evaluation,
            lock_path=self.lock_path,
            compile_cache_dir=str(self.store.path.parent / "compile-cache") if self.store else None,
            on_gpu=self.backend.torch_device != "cpu",
        )

    def reference_timing(self) -> TimingStats:
        """The reference's timing on this device, by the same harness (cached in the store)."""
        with self._reference_lock:
            return self._reference_timing()

    def _reference_timing(self) -> TimingStats:
        if self._reference is not None:
            return self._reference
        key = stable_hash("reference", self.problem.key, self._device.key, self.toolchain, torch.__version__)
        cached = self.store.get_reference_timing(key) if self.store and self.config.evaluation.cache else None
        if cached is None:
            result = self.executor.run([self._job("reference")])[0]
            if result.outcome is not Outcome.correct or result.timing is None:
                raise EvaluationError(f"the reference of {self.problem.name} failed: {result.message}")
            cached = result.timing
            if self.store is not None:
                self.store.save_reference_timing(key, cached)
        self._reference = cached
        return cached

    # -- evaluation -----------------------------------------------------------------------------

    def _precheck(self, candidate: Candidate, key: str) -> EvalRecord | None:
        if candidate.language != self.backend.language:
            return self._record(
                candidate,
                key,
                JobResult(
                    outcome=Outcome.compile_error,
                    message=f"candidate is {candidate.language}, backend {self.backend.name} compiles {self.backend.language}",
                ),
            )
        reasons = check_source(candidate) + hooks.static_checks(candidate, self.problem.name)
        if reasons:
            return self._record(
                candidate,
                key,
                JobResult(outcome=Outcome.rejected, message="static check: " + "; ".join(reasons)),
            )
        return None

    def _record(self, candidate: Candidate, key: str, result: JobResult) -> EvalRecord:
        _warn_unprotected(result)
        record = EvalRecord(
            candidate_hash=candidate.content_hash,
            eval_key=key,
            problem=self.problem.name,
            backend=self.backend.name,
            device=self._device.key,
            toolchain=self.toolchain,
            outcome=result.outcome,
            message=result.message,
            log=result.log,
            timing=result.timing,
            compile_time_s=result.compile_time_s,
            resources=result.resources,
        )
        if result.outcome is Outcome.correct and result.timing is not None:
            ref = self.reference_timing()
            record.reference_timing = ref
            record.speedup = ref.median_ms / result.timing.median_ms
            a = self.problem.analysis()
            record.roofline_fraction = roofline_fraction(
                self._device, result.timing.median_ms / 1e3, a.bytes_moved, a.flops
            )
            over_roof = record.roofline_fraction is not None and record.roofline_fraction > 1.0
            record.roofline_flag = over_roof or record.speedup > self.config.evaluation.flag_speedup_above
        return record

    def _finish(self, candidate: Candidate, record: EvalRecord) -> EvalRecord:
        if self.store is not None:
            self.store.save_candidate(candidate, self.run_id)
            if not record.cached or not self._stored_for_run(record.eval_key):
                self.store.save_evaluation(record, self.run_id)
        hooks.candidate_evaluated(candidate, record)
        return record

    def _stored_for_run(self, key: str) -> bool:
        assert self.store is not None
        return self.store.has_evaluation(key, self.run_id)

    def evaluate(self, candidate: Candidate) -> EvalRecord:
        """Evaluate one candidate (served from the store when an identical evaluation exists)."""
        return self.evaluate_many([candidate])[0]

    def evaluate_many(
        self, candidates: list[Candidate], on_record: Callable[[int, EvalRecord], None] | None = None
    ) -> list[EvalRecord]:
        """Evaluate candidates through the executor (concurrently where it allows); records in order.

        ``on_record(index, record)`` is called in this thread as each record is ready (cached and
        rejected ones first, then executor results as they finish), so a caller can store them then;
        an exception it raises stops the batch (jobs not started are cancelled) and propagates.
        """
        records: list[EvalRecord | None] = [None] * len(candidates)

        def done(i: int, record: EvalRecord) -> None:
            records[i] = record
            if on_record is not None:
                on_record(i, record)

        pending: list[tuple[int, str]] = []
        for i, candidate in enumerate(candidates):
            key = self.eval_key(candidate)
            # Static checks always run (cheap, and plugins may add vetoes): a cached verdict never
            # bypasses them, and their rejections are stored under their own key, never served.
            early = self._precheck(candidate, f"{key}-static")
            if early is not None:
                done(i, self._finish(candidate, early))
                continue
            cached = (
                self.store.cached_evaluation(key) if self.store and self.config.evaluation.cache else None
            )
            if cached is not None:
                done(i, self._finish(candidate, cached))
            else:
                pending.append((i, key))
        if pending:
            self.reference_timing()
            jobs = [self._job("evaluate", candidates[i]) for i, _ in pending]
            results = self.executor.run_iter(jobs)
            with contextlib.ExitStack() as stack:  # closed early: the executor cancels unstarted jobs
                if hasattr(results, "close"):
                    stack.callback(results.close)
                for j, result in results:
                    i, key = pending[j]
                    if _environment_failure(result):  # stored, but never served from the cache
                        key = f"{key}-env"
                    if result.outcome is Outcome.correct and result.clock == "judge":
                        result = self._retime(candidates[i], result)
                    record = self._record(candidates[i], key, result)
                    if record.roofline_flag:
                        record = self._remeasure(candidates[i], key, record)
                    done(i, self._finish(candidates[i], record))
        return [r for r in records if r is not None]

    def _retime(self, candidate: Candidate, first: JobResult) -> JobResult:
        """A job whose device events the judge's clock did not confirm, run once more in a fresh runner.

        An honest kernel's events are confirmed there unless the disagreement was real; then (and for
        hidden work, which disagrees every time) the judge's clock counts, the lower of the two jobs'.
        A candidate correct in the first job and not in the second is rejected.
        """
        assert first.timing is not None
        second = self.executor.run([self._job("evaluate", candidate)])[0]
        if second.outcome is not Outcome.correct or second.timing is None:
            return JobResult(
                outcome=Outcome.rejected,
                log=second.log,
                message=(
                    f"its device events were not confirmed, and re-timed in a fresh job it failed: {second.message}"
                ),
            )
        if second.clock == "events":
            note = f"; re-timed in a fresh job (the first job's clock did not confirm its events, {first.timing.median_ms:.4g} ms)"
            return second.model_copy(update={"message": second.message + note})
        best = min((first, second), key=lambda r: r.timing.median_ms if r.timing else float("inf"))
        note = (
            "; timed by the judge's clock: the device events were not confirmed in two jobs "
            f"({first.timing.median_ms:.4g} and {second.timing.median_ms:.4g} ms per call)"
        )
        return best.model_copy(update={"message": best.message + note})

    def _remeasure(self, candidate: Candidate, key: str, first: EvalRecord) -> EvalRecord:
        """A flagged kernel measured again, in a fresh job, by the differential method.

        Kept (with its first time) only if the second measurement is correct and not
        more than :data:`REMEASURE_TOLERANCE` times slower than the first; otherwise rejected, with
        both times, so it can never become an elite or be exported.
        """
        assert first.timing is not None
        job = self._job("evaluate", candidate).model_copy(update={"timing_method": "differential"})
        second = self.executor.run([job])[0]
        if second.outcome is not Outcome.correct or second.timing is None:
            return self._record(
                candidate,
                key,
                JobResult(
                    outcome=Outcome.rejected,
                    log=second.log,
                    message=(
                        f"flagged ({first.speedup:.1f}x) and re-measured by the differential method: {second.message}"
                    ),
                ),
            )
        ratio = second.timing.median_ms / first.timing.median_ms
        if ratio > REMEASURE_TOLERANCE:
            return self._record(
                candidate,
                key,
                JobResult(
                    outcome=Outcome.rejected,
                    log=first.log,
                    message=(
                        f"flagged ({first.speedup:.1f}x) and re-measured: the differential method took "
                        f"{second.timing.median_ms:.4g} ms per call, {ratio:.2f}x the first measurement "
                        f"({first.timing.median_ms:.4g} ms): the two timing methods disagree"
                    ),
                ),
            )
        # the first (standard) time stays: the differential one is the cross-check, coarser on a GPU
        result = JobResult(
            outcome=Outcome.correct,
            message=first.message
            + (
                f"; flagged, re-measured by the differential method: {second.timing.median_ms:.4g} ms per call "
                f"({ratio:.2f}x)"
            ),
            log=first.log,
            timing=first.timing,
            compile_time_s=first.compile_time_s,
            resources=first.resources,
        )
        return self._record(candidate, key, result)

    def close(self) -> None:
        """Release the executor's workers."""
        self.executor.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
