"""Running one recipe against the eager output, and the clocks (CUDA events on a GPU, the host clock
on PoCL), for the KernelBench table (``kernelbench.py``) and its warm-up (``kernelbench_warm.py``)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

Timer = Callable[[Callable[[], Any], int], float]

#: the table's correctness tolerance for fp32 outputs (fp16 / bf16: the judge's, ``verifier.tolerances``)
RTOL = ATOL = 1e-3


def make_timer(device: torch.device) -> Timer:
    """Median ms of ``repeats`` calls: CUDA events on a GPU, the host clock (after a sync) elsewhere."""

    def gpu(fn: Callable[[], Any], repeats: int) -> float:
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def host(fn: Callable[[], Any], repeats: int) -> float:
        from kfoundry.runtime import synchronize

        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return gpu if device.type == "cuda" else host


def judge_timer(backend: Any, max_repeats: int = 50) -> Timer | None:
    """Median ms of ``repeats`` calls (at most ``max_repeats``: each costs a 0.5 ms spin more) on the
    backend's own device clock (the judge's: on CUDA a spin and an L2 flush before each call, so launch
    overhead is hidden and the cache is cold), or None without one."""
    one = backend.device_timer()
    if one is None:
        return None

    def timed(fn: Callable[[], Any], repeats: int) -> float:
        return statistics.median(one(fn) for _ in range(min(repeats, max_repeats)))

    return timed


def time_ms(fn: Callable[[], Any], timer: Timer, budget_s: float) -> float:
    """Median ms of ``fn`` over about ``budget_s`` seconds of calls (3 to 200), after a warm-up call. A
    call that takes over ten budgets (and 0.5 s) is timed once: its second call's host time is the row's
    (such a recipe is far off the pace; three more calls would only stall the table)."""
    fn()  # compile / warm up
    t0 = time.perf_counter()
    fn()
    _sync()
    one = max(time.perf_counter() - t0, 1e-6)
    if one > max(10 * budget_s, 0.5):
        return one * 1e3
    repeats = int(min(200, max(3, budget_s / one)))
    return timer(fn, repeats)


def _sync() -> None:
    from kfoundry.runtime import synchronize

    synchronize()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def device_usable(device: torch.device) -> bool:
    """False once the CUDA context is lost (an illegal address or a launch failure is sticky)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device=device).add_(1).item()
    except Exception:
        return False
    return True


#: ``close``'s error where the fixed tolerance failed and the judge's float64-calibrated bounds passed
BY_FLOAT64 = -2.0


def close(got: Any, expected: torch.Tensor, truth: Callable[[], Any] | None = None) -> tuple[bool, float]:
    """Whether ``got`` matches ``expected`` (shape, then allclose at the table's tolerance), with the
    max error where it does not (-1: another shape or not a tensor). Where the tolerance fails and
    ``truth`` gives the reference's float64 output, the judge's own criterion decides instead
    (``tolerance.compare_output``: the error against float64 within what eager's own float32 error
    allows): an output near zero after cancellation, which eager itself gets wrong by more than 1e-3,
    is then judged as ``kf-run`` judges it; the error returned is ``BY_FLOAT64``."""
    from kfoundry.core.evaluation.tolerance import compare_output
    from kfoundry.core.evaluation.verifier import LOW_PRECISION, tolerances

    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False, -1.0
    # fp32: the table's 1e-3; fp16 / bf16 outputs: the judge's (a bf16 ulp is 2^-8 of the value)
    atol, rtol = tolerances(expected.dtype, None, None) if expected.dtype in LOW_PRECISION else (ATOL, RTOL)
    ok = torch.allclose(got.float(), expected.float(), rtol=rtol, atol=atol, equal_nan=True)
    if ok:
        return True, 0.0
    err = (got.float() - expected.float()).abs().max().item()
    ref64 = truth() if truth is not None and got.dtype == expected.dtype else None
    if isinstance(ref64, torch.Tensor) and compare_output(0, got, expected, ref64, None, None) is None:
        return True, BY_FLOAT64
    return False, err


def float64_truth(ref: Any, inputs: list[Any]) -> Callable[[], Any]:
    """The reference's float64 output on ``inputs``, computed on the first call only (None where the
    reference does not run in float64 or gives no one floating output)."""
    from kfoundry.core.evaluation.tolerance import float64_reference

    done: list[Any] = []

    def truth() -> Any:
        if not done:
            outs = float64_reference(ref, inputs)
            done.append(outs[0] if outs is not None and len(outs) == 1 else None)
        return done[0]

    return truth


def expected_output(
    ref: Any, problem: Any, inputs: list[Any], seed: int, device: torch.device
) -> tuple[Any, list[Any]]:
    """(eager output, inputs for the recipes): a reference that writes its inputs in place (their version
    counters moved) gets them drawn again from the same seed, so every recipe sees what eager saw."""
    versions = [t._version if isinstance(t, torch.Tensor) else None for t in inputs]
    expected = ref(*inputs)
    if any(isinstance(t, torch.Tensor) and t._version != v for t, v in zip(inputs, versions, strict=True)):
        inputs = problem.make_inputs(seed, device)
    return expected, inputs


def eager_wall_s(ref: Any, problem: Any, inputs: list[Any], device: torch.device) -> tuple[float, list[Any]]:
    """(wall seconds of one synchronised eager call, the inputs for what follows): a reference that wrote
    its inputs in place gets them drawn again (``expected_output``'s seed), so later recipes see eager's."""
    from kfoundry.runtime import synchronize

    start = time.perf_counter()
    with torch.no_grad():
        _, inputs = expected_output(ref, problem, inputs, 1, device)
    synchronize()
    return time.perf_counter() - start, inputs


def _wall_ms(model: Any, inputs: list[Any]) -> float:
    """Wall milliseconds of one synchronised call of ``model`` (built and warmed already)."""
    from kfoundry.runtime import synchronize

    start = time.perf_counter()
    model(*inputs)
    synchronize()
    return (time.perf_counter() - start) * 1e3


def run_recipe(
    recipe: Any,
    problem: Any,
    inputs: list[Any],
    expected: torch.Tensor,
    device: torch.device,
    timer: Timer | None,
    budget_s: float,
    load: Any,
    truth: Callable[[], Any] | None = None,
) -> tuple[float | None, float]:
    """(median ms, 0 or ``BY_FLOAT64``) of ``recipe`` at its defaults if it matches the eager output
    (:func:`close`, ``truth`` its float64 fallback), else (None, max error); ``timer`` None: correctness
    only, with the wall ms of a second call where the first (its build and first launch included) took
    over a second (else 0), so a slow build is told from a slow kernel."""
    from kfoundry.runtime import synchronize

    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs()).to(device)
    with torch.no_grad():
        first = time.perf_counter()
        got = model(*inputs)
        synchronize()  # launches are asynchronous
        first = time.perf_counter() - first
        ok, err = close(got, expected, truth)
        del got
        if not ok:
            return None, err
        if timer is None:
            return (_wall_ms(model, inputs) if first > 1.0 else 0.0), err
        return time_ms(functools.partial(model, *inputs), timer, budget_s), err
