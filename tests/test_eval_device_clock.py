"""The judge's rule for trusting a runner's CUDA events: its own differential clock must confirm them.

No GPU needed: the rule is a function of the two sets of per-call times (events from the runner, the
judge's clock from pairs of batches), so every case an attacker can produce is a pair of lists here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from kfoundry.core.evaluation import clocking
from kfoundry.core.evaluation.clocking import DEVICE_SHARE, _device_or_judge, median_error


@dataclass
class _Judge:
    log: list[str] = field(default_factory=list)
    clock_disagreements: int = 0
    disagreement_samples: list[str] = field(default_factory=list)
    timer_overhead_error: float | None = 0.002
    clock_used: str | None = None


def _noisy(mean: float, sd: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [max(1e-6, rng.gauss(mean, sd)) for _ in range(n)]


def test_honest_events_are_confirmed_and_count() -> None:
    events = _noisy(0.134, 0.001, 200, 1)
    clocked = _noisy(0.136, 0.004, 12, 2)  # the judge's clock: a little above, within its own noise
    judge = _Judge()
    assert _device_or_judge(judge, events, clocked) is events  # type: ignore[arg-type]
    assert judge.clock_disagreements == 0 and "allowed" in judge.log[-1]


@pytest.mark.parametrize("hidden_share", [0.2, 0.5, 3.0])
def test_work_the_events_miss_puts_the_judges_clock_in_charge(hidden_share: float) -> None:
    """A side stream (or faked events) hides work: the judge's clock sees it, and counts once it is over
    the share plus three standard errors."""
    events = _noisy(0.100, 0.001, 200, 3)
    clocked = _noisy(0.100 * (1 + hidden_share), 0.003, 12, 4)
    judge = _Judge()
    assert _device_or_judge(judge, events, clocked) is clocked  # type: ignore[arg-type]
    assert judge.clock_disagreements == 1 and "allowed" in judge.disagreement_samples[0]


def test_a_noisy_judges_clock_cannot_widen_the_margin_past_its_cap() -> None:
    """A candidate that adds random host delays to make the judge's clock noisy (so that a margin of
    standard errors would grow) gains at most the capped margin: hidden work beyond it still counts."""
    events = _noisy(0.050, 0.0005, 200, 5)
    cap = max(clocking.DEVICE_NOISE_FLOOR_MS, clocking.DEVICE_NOISE_SHARE * 0.05)
    hidden = 0.050 * (1 + DEVICE_SHARE) + clocking.DEVICE_SIGMAS * cap * 1.3
    clocked = _noisy(hidden, 0.2, 400, 6)  # the median stays near `hidden`; the error is huge
    judge = _Judge()
    assert _device_or_judge(judge, events, clocked) is clocked  # type: ignore[arg-type]
    assert "allowed" in judge.disagreement_samples[0] and judge.clock_used == "judge"


def test_the_most_a_candidate_can_hide_is_the_share_plus_capped_noise() -> None:
    """The bound, computed: hidden work of more than DEVICE_SHARE plus three capped standard errors is
    never confirmed; at 0.1 ms a call that is at most 1.5x, at 1 ms under 1.25x (the old margin, 25% +
    0.25 ms, let a 0.1 ms kernel read as free)."""

    def bound(ev: float) -> float:
        cap = max(clocking.DEVICE_NOISE_FLOOR_MS, clocking.DEVICE_NOISE_SHARE * ev)
        return ev * (1 + DEVICE_SHARE) + clocking.DEVICE_SIGMAS * cap

    assert bound(0.1) <= 0.1 * 1.5 + 1e-12 and bound(1.0) < 1.0 * 1.25
    judge = _Judge(timer_overhead_error=1.0)  # even a hopeless calibration does not widen it
    assert _device_or_judge(judge, [0.1] * 50, [bound(0.1) * 1.001] * 12) != [0.1] * 50  # type: ignore[arg-type]


def test_unusable_events_leave_the_judges_clock() -> None:
    judge = _Judge()
    assert _device_or_judge(judge, [], [0.2, 0.21]) == [0.2, 0.21]  # type: ignore[arg-type]


def test_median_error_shrinks_with_more_samples() -> None:
    few, many = _noisy(1.0, 0.1, 10, 7), _noisy(1.0, 0.1, 1000, 8)
    assert median_error(many) < median_error(few)
    assert 0.08 / 1000**0.5 < median_error(many) < 0.2 / 1000**0.5
    assert median_error([1.0]) == float("inf")


def test_a_delay_in_the_small_batches_does_not_hide_work_from_the_large_batch_clock() -> None:
    """A candidate that knows which batch of a pair is the smaller one (it can read the runner's frame)
    and delays it by its hidden work makes the difference of the pair show nothing; the large batch's
    own clock, less the trusted exchange's fixed cost, still does."""
    events = _noisy(0.035, 0.0005, 200, 9)  # a quarter of the work on the clocked stream
    differential = _noisy(0.036, 0.002, 12, 10)  # the hidden work cancelled by the small batch's delay
    totals = _noisy(0.134, 0.002, 12, 11)  # the large batches alone: all the work
    judge = _Judge()
    assert _device_or_judge(judge, events, differential, totals) is totals  # type: ignore[arg-type]
    assert any("large-batch" in s for s in judge.disagreement_samples)
    # honest: both clocks agree with the events
    judge = _Judge()
    honest = _noisy(0.134, 0.0005, 200, 12)
    assert (
        _device_or_judge(judge, honest, _noisy(0.135, 0.002, 12, 13), _noisy(0.133, 0.002, 12, 14)) is honest
    )  # type: ignore[arg-type]
