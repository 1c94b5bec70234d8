"""Timing statistics: median, IQR, outlier removal, confidence interval; the adaptive repeat count."""

from __future__ import annotations

import pytest

from kfoundry.core.evaluation.timer import measure, summarize


def test_summary_removes_outliers_and_brackets_the_median() -> None:
    times = [1.0 + 0.01 * (i % 7) for i in range(60)] + [50.0, 80.0]
    stats = summarize(times)
    assert stats.n_outliers == 2 and stats.n == 60
    assert stats.ci95_low_ms <= stats.median_ms <= stats.ci95_high_ms
    assert 1.0 <= stats.median_ms <= 1.06
    assert stats.iqr_ms < 0.1 and stats.min_ms == 1.0 and len(stats.times_ms) == 62
    assert stats.spread == pytest.approx(stats.iqr_ms / stats.median_ms)


def test_small_samples_keep_everything() -> None:
    stats = summarize([3.0, 1.0, 2.0])
    assert stats.n == 3 and stats.n_outliers == 0 and stats.median_ms == 2.0
    with pytest.raises(ValueError):
        summarize([])


def test_measure_syncs_around_every_call_and_rotates_inputs() -> None:
    events: list[str] = []
    seen: list[int] = []

    def call(i: int) -> None:
        seen.append(i)
        events.append("call")

    def sync() -> None:
        events.append("sync")

    stats = measure(call, sync, warmup_s=0.0, target_time_s=1e-9, min_repeats=5, max_repeats=9)
    assert stats.n + stats.n_outliers == 5
    assert seen == list(range(len(seen))) and len(seen) == 2 + 5  # two warm-up calls, then the repeats
    # every call is preceded and followed by a device synchronisation
    for k, e in enumerate(events):
        if e == "call":
            assert events[k - 1] == "sync" and events[k + 1] == "sync"


def test_measure_adapts_repeats_to_the_time_budget() -> None:
    stats = measure(
        lambda i: sum(range(2000)),
        lambda: None,
        warmup_s=0.0,
        target_time_s=10.0,
        min_repeats=3,
        max_repeats=40,
    )
    assert stats.n + stats.n_outliers == 40
