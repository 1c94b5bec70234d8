"""Timing on the judge's side: calibration, paired batches, device events checked against the judge's clock."""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

import torch

from kfoundry.core.evaluation import device_share
from kfoundry.core.evaluation.jobs import JobResult
from kfoundry.core.evaluation.judge import (
    DEVICE_ROTATE_MAX,
    DEVICE_ROTATE_SHARE,
    Judge,
    mark_aliasing,
    nbytes,
)
from kfoundry.core.evaluation.runner_handle import JobFailed, RunnerHandle
from kfoundry.core.evaluation.timer import summarize
from kfoundry.core.models import Outcome, TimingStats

#: Most distinct input sets in one timed batch.
MAX_BATCH = 512


def calibrate(
    runner: RunnerHandle, device: str, probe: device_share.IdleProbe | None, rounds: int = 9
) -> float | None:
    """What one clocked exchange of one device-timed empty call costs beyond its events (ms), measured
    before any candidate code has run in the runner (so nothing can inflate it).

    Before each exchange the judge uses the device itself, as it does between timed batches (drawing
    and copying inputs), so the GPU's switch from the judge's context to the runner's is counted; the
    exchange ends as timed ones do (with the idle probe, where there is one).
    """
    extra: list[float] = []
    settle = probe.wait_idle if probe is not None else None
    for _ in range(rounds):
        torch.rand(1 << 20, device=device).cpu()
        reply, ns = runner.exchange({"op": "calibrate"}, settle=settle)
        events = reply.get("device_ms")
        if not isinstance(events, list) or len(events) != 1 or not isinstance(events[0], (int, float)):
            return None
        extra.append(ns / 1e6 - float(events[0]))
    return sorted(extra)[len(extra) // 2]


def calibrate_calls(
    runner: RunnerHandle, probe: device_share.IdleProbe | None, calls: int = 16, rounds: int = 7
) -> tuple[float, float, float] | None:
    """What one timed call costs on the judge's clock beyond its device events, on the runner's real call
    path with a trusted forward (an output allocation and a no-op launch), before any candidate code
    runs: the difference of exchanges of ``calls`` and ``2 * calls`` calls, so no fixed cost is in it;
    that fixed cost of one exchange; and the per-call figure's standard error. (per-call ms, fixed ms,
    error ms), or None where the runner has no trusted forward (the runner's own figure is used then)."""
    settle = probe.wait_idle if probe is not None else None
    samples: list[float] = []
    fixed: list[float] = []
    for _ in range(rounds):
        measured = []
        for n in (calls, 2 * calls):
            reply, ns = runner.exchange({"op": "calibrate", "calls": n}, settle=settle)
            events = _event_samples(reply.get("device_ms"), n) if reply.get("ok") is True else []
            if not events:
                return None
            measured.append((ns / 1e6, sum(events)))
        (t1, e1), (t2, e2) = measured
        samples.append((t2 - t1 - (e2 - e1)) / calls)
        fixed.append(2 * (t1 - e1) - (t2 - e2))
    return max(0.0, _median(samples)), max(0.0, _median(fixed)), median_error(samples)


def time_candidate(judge: Judge, verify: bool) -> tuple[TimingStats, int, int]:
    """Batches of calls on distinct fresh inputs, clocked by the judge: (stats, calls, verified calls)."""
    ev = judge.job.evaluation
    variant = judge.variants[0]
    sample = variant.problem.make_inputs(secrets.randbits(31), judge.device)
    per_set = max(1, nbytes(sample))
    capacity_sets = int(max(1, min(MAX_BATCH, max(ev.rotate_bytes, per_set) // per_set)))
    if judge.shared is not None:
        # on a GPU a batch must be long enough for the judge's clock to matter: up to DEVICE_ROTATE_SHARE
        # of the free device memory (at most DEVICE_ROTATE_MAX) in distinct input sets
        free, _total = torch.cuda.mem_get_info()
        capacity_sets = int(
            max(capacity_sets, min(MAX_BATCH, min(DEVICE_ROTATE_MAX, free * DEVICE_ROTATE_SHARE) // per_set))
        )
    judge.open_arena(
        4096 if judge.shared is not None else capacity_sets * (per_set + 64 * (len(sample) + 1)) + 4096
    )
    slots = judge.add_slots([sample])
    current = [sample]
    rng = secrets.SystemRandom()

    def refill(ids: list[int]) -> list[list[Any]]:
        sets = [variant.problem.make_inputs(secrets.randbits(31), judge.device) for _ in ids]
        judge.write(ids, sets)
        return sets

    # warm-up, one call at a time, fresh inputs each call
    warm: list[float] = []
    warm_events: list[float] = []
    drawing: list[float] = []
    start = time.monotonic()
    while len(warm) < 2 or time.monotonic() - start < ev.warmup_s:
        t0 = time.monotonic()
        current = refill(slots[:1])
        drawing.append(time.monotonic() - t0)
        # sized from the whole exchange: on a GPU, batches of many more calls carry more of the
        # forward's own host work than the margin allows (measured, benchmarks/NOTES.md)
        _, ns, warm_reply = judge.call(0, slots[:1], "warm-up", judge.device != "cpu")
        warm.append(ns / 1e9)
        warm_events += _event_samples(warm_reply.get("device_ms"), 1)
    per_call = sorted(warm)[len(warm) // 2]
    per_draw = sorted(drawing)[len(drawing) // 2]
    differential = judge.job.timing_method == "differential"
    batch = int(min(capacity_sets, max(1, -(-ev.batch_time_s // max(per_call, 1e-9)))))
    # batches of b and 2b calls: the difference of the judge's clock over them has no fixed cost in it
    # (the independent method; on a device also the judge's check on the device events)
    device_clock = (
        judge.device != "cpu" and judge.timer_overhead_ms is not None and judge.exchange_ms is not None
    )
    paired = (differential or device_clock) and capacity_sets >= 2
    if paired:
        if device_clock and not differential:
            # pairs of b and 2b calls of DEVICE_PAIR_BATCH_S at least (by the per-call cost on the judge's
            # clock: the calibrated overhead plus the warm-up's events), so the exchange's jitter over b
            # calls is small beside the margin the events are held to
            marginal = (judge.timer_overhead_ms or 0.0) + (_median(warm_events) if warm_events else 0.0)
            batch = max(batch, 2 * int(-(-DEVICE_PAIR_BATCH_S * 1e3 // max(marginal, 1e-3))))
            batch = int(min(capacity_sets, batch))
        batch = max(2, batch - batch % 2)
    if batch > len(slots):
        more = [
            variant.problem.make_inputs(secrets.randbits(31), judge.device) for _ in range(batch - len(slots))
        ]
        slots += judge.add_slots(more)
    slots = slots[:batch]
    repeats = int(
        min(ev.max_repeats, max(ev.min_repeats, -(-ev.target_time_s // max(per_call * batch, 1e-9))))
    )
    # Fresh inputs for every call can cost more than the calls (a vector add draws its inputs slower than
    # it adds them): drawing gets at most twice the measuring time, never fewer than min_repeats batches.
    affordable = int(2 * ev.target_time_s // max(per_draw * batch, 1e-9))
    repeats = max(ev.min_repeats, min(repeats, affordable))
    samples: list[float] = []
    verified = 0
    calls = 0
    chance = min(1.0, ev.verified_batches / repeats)
    device_timing = judge.device != "cpu"
    events: list[float] = []
    totals: list[float] = []
    pairs: list[str] = []  # diagnostics: the judge's and the events' times of the first batch pairs
    for r in range(repeats):
        if paired:
            half = batch // 2
            current = refill(slots[:half])
            _, small_ns, small_reply = judge.call(0, slots[:half], "while timed", device_timing)
            calls += half
            events += _event_samples(small_reply.get("device_ms"), half)
        current = refill(slots)
        described, ns, reply = judge.call(0, slots, "while timed", device_timing)
        if paired:
            overhead = (
                judge.timer_overhead_ms if device_timing and judge.timer_overhead_ms is not None else 0.0
            )
            samples.append(max((ns - small_ns) / 1e6 / (batch - half) - overhead, 1e-6))
            if judge.exchange_fixed_ms is not None:
                # the large batch alone, less the trusted exchange's fixed cost (and a slack for honest
                # variation in it): nothing done in the small batch can lower this one
                net = ns / 1e6 - judge.exchange_fixed_ms - EXCHANGE_FIXED_SLACK_MS
                totals.append(max(net / batch - overhead, 1e-6))
            events += _event_samples(reply.get("device_ms"), batch)
            if len(pairs) < PAIRS_LOGGED:
                pairs.append(_pair_line(small_ns, ns, small_reply, reply, judge.last_phases))
        else:
            samples.append(_per_call_ms(ns / 1e6, batch, reply.get("device_ms"), judge))
        calls += batch
        # the final batch always (work left running past its answer is caught), others at random
        if not verify or (r < repeats - 1 and rng.random() >= chance):
            continue
        picks = {batch - 1} | set(rng.sample(range(batch), min(ev.verify_per_batch, batch)))
        for k in sorted(picks):
            refs, ref64 = judge.reference(variant, current[k])
            mark_aliasing(refs, current[k])
            _, verdict = judge.check_call(variant, slots[k], current[k], described[k], k, refs, ref64)
            verified += 1
            if verdict is not None:
                raise JobFailed(
                    JobResult(
                        outcome=Outcome.rejected,
                        message=(
                            f"wrong while timed (call {k + 1} of batch {r + 1}; results cached, work skipped or left "
                            f"running): {verdict.message}"
                        ),
                    )
                )
    if pairs:
        judge.log.append(
            f"clock pairs (b={batch // 2}; judge ms b/2b, events ms b/2b, runner phases 2b): "
            + "; ".join(pairs)
        )
    if paired and not differential and judge.job.kind == "reference" and events:
        # no candidate code runs in a reference job's runner: its events are the trusted device clock
        judge.clock_used = "events"
        judge.log.append(f"reference: its device events count (median {_median(events):.4f} ms per call)")
        samples = events
    elif paired and not differential:
        samples = _device_or_judge(judge, events, samples, totals)
    return summarize(samples), calls, verified


#: Batch pairs whose raw times the judge's log keeps (diagnostics only).
PAIRS_LOGGED = 6


def _pair_line(
    small_ns: int, ns: int, small_reply: dict[str, Any], reply: dict[str, Any], phases: list[float]
) -> str:
    """One batch pair's raw times for the log: judge's clock and summed events of b and 2b calls."""

    def events(r: dict[str, Any]) -> str:
        ms = r.get("device_ms")
        return (
            f"{sum(ms):.3f}" if isinstance(ms, list) and all(isinstance(x, (int, float)) for x in ms) else "-"
        )

    return f"{small_ns / 1e6:.3f}/{ns / 1e6:.3f}, {events(small_reply)}/{events(reply)}, " + "/".join(
        f"{x:.2f}" for x in phases
    )


def _event_samples(device_ms: Any, calls: int) -> list[float]:
    """Per-call device times of one batch (none if the runner's answer is not a list of ``calls`` numbers)."""
    if not isinstance(device_ms, list) or len(device_ms) != calls:
        return []
    if not all(isinstance(x, (int, float)) and 0 < x < 1e6 for x in device_ms):
        return []
    return [float(x) for x in device_ms]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def median_error(values: list[float]) -> float:
    """The standard error of a median (normal approximation, spread from the MAD): 1.2533 * 1.4826 * MAD / sqrt(n)."""
    if len(values) < 2:
        return float("inf")
    mid = _median(values)
    mad = _median([abs(v - mid) for v in values])
    return 1.2533 * 1.4826 * mad / math.sqrt(len(values))


def _device_or_judge(
    judge: Judge, events: list[float], clocked: list[float], totals: list[float] | None = None
) -> list[float]:
    """The device events' per-call times, if the judge's clocks confirm them, else the judge's own.

    ``clocked`` are the judge's per-call times from pairs of batches of b and 2b calls (their difference:
    no exchange or other fixed cost in it, the trusted forward's per-call overhead removed); ``totals``
    the large batches alone less the trusted exchange's fixed cost, so time a candidate adds to the
    small batches only (to shrink the difference) does not help it. The events count when each of the
    judge's medians exceeds theirs by at most :data:`DEVICE_SHARE` plus :data:`DEVICE_SIGMAS` standard
    errors (of that median and of the calibrated per-call overhead), the error counted at most
    :data:`DEVICE_NOISE_FLOOR_MS` or :data:`DEVICE_NOISE_SHARE` of the events: a candidate that makes the
    judge's clock noisy cannot widen the margin past that. Work the events do not see (another stream,
    faked events) beyond the margin is on the judge's clock.
    """
    judge.clock_used = "judge"
    if not events:
        judge.log.append("device events unusable: the judge's differential clock counted")
        return clocked
    ev_median = _median(events)
    noise_cap = max(DEVICE_NOISE_FLOOR_MS, DEVICE_NOISE_SHARE * ev_median)
    calibration = judge.timer_overhead_error if judge.timer_overhead_error is not None else 0.0
    verdicts: list[tuple[str, list[float], bool]] = []
    for name, clock in (("differential", clocked), ("large-batch", totals or [])):
        if not clock:
            continue
        median = _median(clock)
        error = math.hypot(median_error(clock), calibration)
        allowed = ev_median * (1 + DEVICE_SHARE) + DEVICE_SIGMAS * min(error, noise_cap)
        judge.log.append(
            f"judge's {name} clock {median:.4f} ms per call (standard error {error:.4f} with the "
            f"calibration's) against device events {ev_median:.4f} ms, allowed {allowed:.4f} "
            f"({len(clock)} batches, {len(events)} events)"
        )
        confirmed = median <= allowed
        if not confirmed:
            judge.disagreement_samples.append(
                f"{name} {median:.4f} ms, events {ev_median:.4f} ms per call, allowed {allowed:.4f}"
            )
        verdicts.append((name, clock, confirmed))
    if all(confirmed for _, _, confirmed in verdicts):
        judge.clock_used = "events"
        return events
    judge.clock_disagreements += 1
    return max((clock for _, clock, _ in verdicts), key=_median)


#: The device events count when the judge's own clock per call (the difference of batches of b and 2b
#: calls, less the per-call overhead of a trusted forward measured the same way before candidate code
#: ran) exceeds them by no more than this share plus DEVICE_SIGMAS standard errors of its median.
#: On the H200 honest kernels read within about this of their events (benchmarks/NOTES.md, issue 18).
DEVICE_SHARE = 0.05
DEVICE_SIGMAS = 3.0
#: The standard error counts in the margin up to the larger of these (so at most 5% + 3 x 5% = 20% of
#: the events, or 0.045 ms per call, can hide; measured on the H200: benchmarks/NOTES.md, issue 18).
DEVICE_NOISE_FLOOR_MS = 0.015
DEVICE_NOISE_SHARE = 0.05
#: Honest exchanges' fixed cost may exceed the trusted one's by this much (the large-batch clock's slack).
EXCHANGE_FIXED_SLACK_MS = 0.5
#: Batches of a pair last at least this long on the judge's clock (the device only).
DEVICE_PAIR_BATCH_S = 0.02

#: Where no pairs of batches fit (one input set per batch): per call and per batch on top of the share.
DEVICE_PER_CALL_MS = 0.25
DEVICE_PER_BATCH_MS = 0.5


def _per_call_ms(wall_ms: float, batch: int, device_ms: Any, judge: Judge) -> float:
    """One timing sample (ms per call) from one batch.

    Without calibration (the CPU) it is the judge's clock over the batch. On a device it is the device
    events, unless the judge's clock less what the same exchange cost with an empty call and the device
    timer's own per-call overhead (both measured before any candidate code ran, so the candidate cannot
    inflate them) says more than the bounded margin above; then the judge's clock counts. Faked small
    events lose to the judge's clock, and work on another stream or left queued is on the judge's clock
    (the exchange ends only once the GPU is idle); what can hide is bounded by the margin.
    """
    host = wall_ms / batch
    overhead, exchange = judge.timer_overhead_ms, judge.exchange_ms
    if overhead is None or exchange is None:
        return host
    charged = max(wall_ms - exchange - (batch - 1) * overhead, 1e-6)
    events = None
    if (
        isinstance(device_ms, list)
        and len(device_ms) == batch
        and all(isinstance(x, (int, float)) for x in device_ms)
    ):
        events = float(sum(device_ms))
    if events is None or not 0 < events <= wall_ms:
        judge.clock_disagreements += 1
        if len(judge.disagreement_samples) < 3:
            judge.disagreement_samples.append(f"{batch} calls: judge {wall_ms:.3f} ms, events unusable")
        return charged / batch
    judge.clock_pairs.append((events, charged))
    if charged > events * (1 + DEVICE_SHARE) + DEVICE_PER_CALL_MS * batch + DEVICE_PER_BATCH_MS:
        judge.clock_disagreements += 1
        if len(judge.disagreement_samples) < 3:
            judge.disagreement_samples.append(
                f"{batch} calls: judge {charged:.3f} ms net of overheads, "
                f"events {events:.3f} ms, runner says {judge.last_phases} ms"
            )
        return charged / batch
    return events / batch
