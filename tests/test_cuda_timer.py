"""The timer's device-clock path (used by the CUDA backend) and the backend's answer without a GPU."""

from __future__ import annotations

from kfoundry.core.evaluation.timer import measure
from kfoundry.plugins.backends.cuda import CudaBackend
from kfoundry.plugins.backends.cuda_launch import driver_device_count


def test_measure_takes_each_repeat_from_the_device_clock() -> None:
    calls: list[int] = []
    clock = iter([2.0, 4.0, 3.0, 5.0, 1.0] * 10)

    def device_timer(run):  # type: ignore[no-untyped-def]
        run()
        return next(clock)

    stats = measure(
        lambda i: calls.append(i),
        lambda: None,
        warmup_s=0.0,
        target_time_s=1e-9,
        min_repeats=5,
        max_repeats=5,
        device_timer=device_timer,
    )
    assert stats.n == 5 and sorted(stats.times_ms) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.median_ms == 3.0
    # two warm-up calls on the host clock, then one call per timed repeat, inputs rotating on
    assert calls == list(range(7))


def test_no_device_timer_without_a_gpu() -> None:
    if driver_device_count()[0]:
        assert CudaBackend().device_timer() is not None
    else:
        assert CudaBackend().device_timer() is None
