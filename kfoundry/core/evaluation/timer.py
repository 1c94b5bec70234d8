"""Timing: warm-up by time, adaptive repeat count, device synchronised before every clock read,
inputs rotated between calls, outliers removed (Tukey fences), median with IQR and a
distribution-free 95% confidence interval for the median (binomial order statistics).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from kfoundry.core.models import TimingStats

# Bound once at import, before any candidate code runs in this process.
_clock_ns = time.perf_counter_ns


def summarize(times_ms: Sequence[float]) -> TimingStats:
    """Robust statistics of per-call times (ms)."""
    data = np.asarray(times_ms, dtype=float)
    if data.size == 0:
        raise ValueError("no timings to summarize")
    q1, q3 = np.percentile(data, [25, 75])
    iqr = q3 - q1
    keep = data[(data >= q1 - 1.5 * iqr) & (data <= q3 + 1.5 * iqr)] if data.size >= 8 else data
    kept = np.sort(keep)
    n = kept.size
    half = 1.96 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    k1, k3 = np.percentile(kept, [25, 75])
    return TimingStats(
        median_ms=float(np.median(kept)),
        iqr_ms=float(k3 - k1),
        ci95_low_ms=float(kept[lo]),
        ci95_high_ms=float(kept[hi]),
        mean_ms=float(kept.mean()),
        min_ms=float(kept[0]),
        n=int(n),
        n_outliers=int(data.size - n),
        times_ms=[float(t) for t in data],
    )


def measure(
    call: Callable[[int], object],
    sync: Callable[[], None],
    *,
    warmup_s: float,
    target_time_s: float,
    min_repeats: int,
    max_repeats: int,
    device_timer: Callable[[Callable[[], object]], float] | None = None,
) -> TimingStats:
    """Time ``call(i)`` (``i`` picks the rotated input set), syncing the device before each clock read.

    With ``device_timer`` (a backend's device-side clock, see ``Backend.device_timer``) each repeat is
    timed by it instead of the host clock.
    """
    i = 0
    sync()
    start = _clock_ns()
    warm_calls = 0
    while warm_calls < 2 or (_clock_ns() - start) < warmup_s * 1e9:
        call(i)
        sync()
        i += 1
        warm_calls += 1
    per_call_s = (_clock_ns() - start) / 1e9 / warm_calls
    repeats = int(min(max_repeats, max(min_repeats, math.ceil(target_time_s / max(per_call_s, 1e-9)))))
    times: list[float] = []
    for _ in range(repeats):
        if device_timer is not None:
            times.append(device_timer(functools.partial(call, i)))
            i += 1
            continue
        sync()
        t0 = _clock_ns()
        call(i)
        sync()
        t1 = _clock_ns()
        times.append((t1 - t0) / 1e6)
        i += 1
    return summarize(times)
