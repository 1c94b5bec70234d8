"""The ncu traffic pass as the run uses it: when it is on, and what a correct record's traffic changes.

``search.options.profile`` = ``"auto"`` (the default) turns the pass on when the run's axes include
``intensity`` or ``hierarchy`` measured and the backend is ``cuda``; ``"on"`` runs it on any backend
(ncu sees CUDA kernels only: elsewhere it reports none, one warning line); ``"off"`` never runs it. Each correct candidate is
profiled once (``kfoundry/core/evaluation/profile.py``, in the sandbox) when it would enter the archive
in the cell its compiled code gives (empty, or better than the elite there, on some island); its
traffic, when the judge's bounds admit it (:func:`.traffic.out_of_bounds`), replaces the
static estimates of intensity and hierarchy (:func:`.traffic.apply_traffic`) and the candidate's cell
follows. Where nothing came back, the first reason is logged once, kept as ``warning`` and appended to
the record's log, and the static estimates stand.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kfoundry.core.archive import fitness
from kfoundry.core.behaviour.traffic import apply_traffic, out_of_bounds, traffic_features
from kfoundry.core.models import Candidate, EvalRecord

log = logging.getLogger("kfoundry.descriptors")

_TRAFFIC_AXES = ("intensity", "hierarchy")


class TrafficProfiler:
    """Runs the pass for one run's evaluator; remembers each candidate's traffic (or that it has none)."""

    def __init__(self, evaluator: Any, problem_flops: float | None, enabled_on: str) -> None:
        self.evaluator = evaluator
        self.problem_flops = problem_flops
        self.backend = enabled_on
        self.warning: str | None = None
        #: Set when ncu is missing, or after three failures in a row (one candidate can fail its own pass:
        #: a refusal or a timeout it printed or caused is not the machine's).
        self.given_up = False
        self._failures = 0
        self._done: dict[str, dict[str, float] | None] = {}
        #: Whether a correct record is worth its pass (set by the loop: it would enter the archive).
        self.admits: Callable[[EvalRecord, dict[str, float]], bool] | None = None
        device = getattr(evaluator, "device", None)
        self.peak_bandwidth_gbs = getattr(device, "peak_bandwidth_gbs", None)
        self.peak_gflops = getattr(device, "peak_gflops", None)
        self.input_bytes: float | None = None

    def bounds(self, traffic: dict[str, float], record: EvalRecord) -> str | None:
        """Why ``traffic`` cannot be the kernel's (:func:`.traffic.out_of_bounds`), else None."""
        median = record.timing.median_ms if record.timing is not None else None
        return out_of_bounds(
            traffic,
            input_bytes=self.input_bytes,
            time_s=median / 1e3 if median else None,
            peak_bandwidth_gbs=self.peak_bandwidth_gbs,
            peak_gflops=self.peak_gflops,
        )

    def traffic(self, candidate: Candidate) -> dict[str, float] | None:
        """The candidate's traffic features, profiled on first use (None when none could be had)."""
        key = candidate.content_hash
        if key not in self._done and not self.given_up:
            self._done[key] = self._profile(candidate)
        if key not in self._done:
            return None
        return self._done[key]

    def _profile(self, candidate: Candidate) -> dict[str, float] | None:
        from kfoundry.core.evaluation.profile import profile_candidate

        result = profile_candidate(self.evaluator._job("evaluate", candidate))
        if result.warning or not result.metrics:
            self._failures += 1
            self.given_up = result.permanent or self._failures >= 3
            return self._warn(result.warning or "profile: ncu reported no metrics")
        self._failures = 0
        feats = traffic_features(result.metrics, self.problem_flops)
        feats["profiled_launches"] = float(result.launches)
        feats["profile_s"] = result.wall_s
        return feats

    def _warn(self, message: str) -> dict[str, float] | None:
        if self.warning is None:
            log.warning(message)
        self.warning = self.warning or message
        return None


def profiler_for_run(strategy: Any, axes: list[Any], evaluator: Any, problem: Any) -> TrafficProfiler | None:
    """The run's profiler, or None when ``search.options.profile`` and the axes leave the pass off."""
    choice = getattr(getattr(strategy, "options", None), "profile", "auto")
    backend = str(getattr(getattr(evaluator, "backend", None), "name", ""))
    wanted = any(a.name in _TRAFFIC_AXES and not a.static for a in axes)
    if choice == "off" or not wanted or not hasattr(evaluator, "_job"):
        return None
    if choice == "auto" and backend != "cuda":
        return None
    try:
        flops = float(problem.flops) if problem is not None else None
    except Exception:
        flops = None
    profiler = TrafficProfiler(evaluator, flops, backend)
    with contextlib.suppress(Exception):
        inputs = problem.input_bytes() if problem is not None else None
        profiler.input_bytes = float(inputs) if inputs else None
    profiler.admits = lambda record, feats: _would_enter(
        getattr(strategy, "archive", None), axes, record, feats
    )
    return profiler


def _would_enter(archive: Any, axes: list[Any], record: EvalRecord, features: dict[str, float]) -> bool:
    """Whether ``record`` would enter its cell (from the compiled code) on some island: empty, or better
    than its elite there. A candidate no island would keep is not worth a pass."""
    if archive is None or not hasattr(archive, "get"):
        return True
    coords = tuple(a.level(features.get(a.name, 0.0)) for a in axes)
    for island in range(int(getattr(archive, "islands", 1))):
        cell = archive.get(coords, island)
        if cell is None or fitness(record) > fitness(cell.record):
            return True
    return False


def with_traffic(
    profiler: TrafficProfiler | None, candidate: Candidate, record: EvalRecord, features: dict[str, float]
) -> dict[str, float] | None:
    """``features`` with the candidate's measured traffic (a correct record, a profiler), else None."""
    if profiler is None or not record.is_correct:
        return None
    if profiler.admits is not None and not profiler.admits(record, features):
        return None
    traffic = profiler.traffic(candidate)
    if traffic is not None:
        why = profiler.bounds(traffic, record)
        if why is None:
            return apply_traffic(features, traffic)
        profiler._warn(f"profile: traffic out of bounds, not used: {why}")
        record.log = f"{record.log}\nprofile: traffic out of bounds, not used: {why}".strip()
        return None
    if profiler.warning and profiler.warning not in record.log:
        record.log = f"{record.log}\n{profiler.warning}".strip()
    return None
