"""The trusted side of one job: the judge.

:func:`execute` runs in a fresh child of the fork server (:mod:`.zygote`). Before it reads a seed or
builds a reference it forks the runner (:mod:`.runner`) — the process that executes the candidate,
confined and in its own PID namespace — and from then on it holds everything the candidate must not
reach: the trial seeds, the reference model and its outputs (float32 and float64), the checker and
the clock. Per call the judge

1. writes fresh inputs into the shared arena while the runner is frozen (SIGSTOP),
2. starts its own clock, thaws the runner, asks for the call(s), stops the clock at the answer and
   freezes the runner again — so no candidate code runs outside a clocked call, and work left
   running when the answer comes is still undone when the judge looks,
3. reads the outputs straight out of the frozen runner's memory and checks them.

On a GPU (CUDA) the inputs are the judge's own device buffers, shared by CUDA IPC and rewritten while
the runner is frozen; each answer names an IPC handle per output, which the judge opens and copies
itself (:mod:`.device_share`), so the runner is never thawed between a call and the check of its
outputs. Each clocked exchange ends only when a probe in the judge's own context finds the GPU idle
(work left queued on any stream is clocked), and a timed batch counts the judge's clock less what
the same exchange cost before candidate code ran, or the device events where they are larger.

Correctness runs many trials (the problem's inputs, boundary shapes, unaligned starts, signed,
normal, huge, tiny and NaN/Inf inputs, more for cheap kernels within a time budget); timing runs
batches of calls on distinct fresh inputs and verifies a random sample of every batch, plus its last
call, so timed calls cannot skip work unseen.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from kfoundry.core.errors import KfError
from kfoundry.core.evaluation import device_share
from kfoundry.core.evaluation.clocking import (
    calibrate,
    calibrate_calls,
    time_candidate,
)
from kfoundry.core.evaluation.compile_lane import DeviceLane
from kfoundry.core.evaluation.compile_service import CompileService, build_with_service
from kfoundry.core.evaluation.correctness import (
    run_correctness,
    variant_index,
)
from kfoundry.core.evaluation.jobs import EvalJob, JobResult, lane_lock_path
from kfoundry.core.evaluation.judge import (
    Judge,
    Variant,
)
from kfoundry.core.evaluation.runner_handle import JobFailed, RunnerHandle, fork_runner
from kfoundry.core.evaluation.timer import _clock_ns
from kfoundry.core.evaluation.trials import TrialPlan, plan_trials
from kfoundry.core.models import Outcome
from kfoundry.core.problem import Problem, load_problem


def _strict_fp32() -> None:
    """fp32 means fp32: no TF32 in the reference's matmuls or cuDNN convolutions."""
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _limit_variants(plan: TrialPlan, keep: int) -> TrialPlan:
    """The plan with at most ``keep`` shape sets besides the problem's own (and their trials)."""
    if len(plan.variants) <= keep + 1:
        return plan
    structured = [s for s in plan.structured if s.variant <= keep]
    reason = plan.fixed_shape_reason or (
        "other shapes not tried (evaluation.shape_variants = 0)" if keep == 0 else None
    )
    return TrialPlan(plan.variants[: keep + 1], reason, structured)


def _variant_label(problem: Problem, base: Problem) -> str:
    changed = {k: v for k, v in problem.shapes.items() if base.shapes.get(k) != v}
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "the problem's shapes"


def _start(
    job: EvalJob,
    runner: RunnerHandle,
    plan: TrialPlan,
    services: list[CompileService | None],
    phase_times: dict[str, tuple[float, float]],
) -> tuple[Judge, dict[str, Any]]:
    """Load the problem variants, calibrate the clocks on a device (in its lane: ``phase_times
    ["calibrate"]``), tell the runner to build (answering its compile requests), wait until it has; the
    compile service used is appended to ``services``."""
    problems = [load_problem(job.problem_path, shapes) for shapes in plan.variants]
    # a uid no other live job's runner has (from its host pid), outside the usual user range
    runner.chan.send({"variants": plan.variants, "uid": 3_000_000 + runner.pid % 1_000_000})
    ready = runner.receive()
    if ready.get("op") != "ready":
        raise JobFailed(
            JobResult(
                outcome=Outcome.runtime_error,
                message=f"setup: {ready.get('error', 'runner did not start')}",
                log=str(ready.get("log", "")),
            )
        )
    device = str(ready.get("torch_device", "cpu"))
    runner.freeze()
    ipc = ready.get("ipc") is True and device.startswith("cuda") and device_share.available()
    probe = device_share.IdleProbe(device) if ipc else None
    exchange_ms = per_call = None
    if device != "cpu":  # in the device's lane: no other job's trials or timing perturb it, nor it them
        with (
            _waits_off_the_clock(DeviceLane(lane_lock_path(job)), runner, None),
            _lane(phase_times, None, "calibrate"),
        ):
            if probe is not None:
                probe.calibrate()
            exchange_ms = calibrate(runner, device, probe)
            per_call = calibrate_calls(runner, probe)
    service = CompileService.for_job(job, ready.get("compile"))  # ``ready`` came before candidate code
    built = build_with_service(
        runner, service
    )  # candidate code runs from here on: nothing it says is trusted
    variants = []
    for i, problem in enumerate(problems):
        reference = problem.make_reference().to(device)
        variants.append(Variant(i, problem, reference, _variant_label(problem, problems[0])))
    judge = Judge(job, runner, device, variants)
    services.append(service)
    judge.exchange_ms = exchange_ms
    if probe is not None:
        judge.probe, judge.shared = probe, device_share.JudgeBuffers(device)
        judge.log.append(
            f"CUDA IPC: the judge owns the inputs and reads the outputs; idle probe {probe.idle_s * 1e6:.0f} us"
        )
    elif device != "cpu":
        judge.log.append(
            "no CUDA IPC here: the runner stages inputs and copies outputs off the device (less isolation)"
        )
    overhead = ready.get("timer_overhead_ms")
    judge.timer_overhead_ms = (
        float(overhead) if isinstance(overhead, (int, float)) and 0 <= overhead < 50 else None
    )
    if per_call is not None:
        per_call_ms, judge.exchange_fixed_ms, judge.timer_overhead_error = per_call
        judge.log.append(
            f"per-call overhead on the judge's clock {per_call_ms:.4f} ms (the runner's own: {overhead}); "
            f"fixed cost of an exchange {judge.exchange_fixed_ms:.4f} ms; standard error {judge.timer_overhead_error:.4f} ms"
        )
        judge.timer_overhead_ms = per_call_ms
    raw_in_force = ready.get("in_force")
    in_force: dict[Any, Any] = raw_in_force if isinstance(raw_in_force, dict) else {}
    judge.sandbox = {str(k): bool(v) for k, v in in_force.items()}
    judge.sandbox_notes = [str(n)[:300] for n in (ready.get("notes") or [])][:20]
    missing = [k for k, v in judge.sandbox.items() if not v]
    if missing:
        judge.log.append(
            "sandbox protections not in force: "
            + ", ".join(missing)
            + "; "
            + "; ".join(ready.get("notes") or [])
        )
    if built.get("ok") is not True:
        raise JobFailed(judge._error_result(built, "build"))
    for note in built.get("notes") or []:
        idx = variant_index(str(note))
        if idx is not None and 0 < idx < len(variants):
            variants[idx].ok = False
        judge.log.append(f"shape variant skipped (the candidate does not build there): {str(note)[:300]}")
    return judge, built


# -- correctness --------------------------------------------------------------------------------


# -- timing ---------------------------------------------------------------------------------------


# -- the job ------------------------------------------------------------------------------------


def execute(job: EvalJob, runner_pid_file: str | None = None) -> JobResult:
    """Run one job: fork the runner, judge it, return the result (the sandbox calls this in a child).

    A job that carries its problem's text (``problem_source``) is run on a private copy of it.
    """
    if job.problem_source is None:
        return _execute(job, runner_pid_file)
    folder = tempfile.mkdtemp(prefix="kf-problem-")
    try:
        path = os.path.join(folder, os.path.basename(job.problem_path) or "problem.py")
        with open(path, "w") as handle:
            handle.write(job.problem_source)
        os.chmod(path, 0o444)  # the runner reads it after it changed its uid (the confinement binds it)
        os.chmod(folder, 0o755)
        return _execute(
            job.model_copy(update={"problem_path": path, "problem_source": None}), runner_pid_file
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _waits_off_the_clock(
    lane: DeviceLane, runner: RunnerHandle, service: CompileService | None
) -> DeviceLane:
    """``lane``, its waits moving the job's deadline (the runner's, the compile service's) and told to
    the sandbox (``<result>.waited``: ``<seconds waited before> <monotonic start of a wait, or ->``), so
    that the wait for another job's turn on the device is not counted against this job's timeout."""
    begun: list[float] = []

    def tell(since: float | None) -> None:
        if since is not None:
            begun[:] = [since]
        elif begun:  # a wait ended: the deadlines move by it
            waited = time.monotonic() - begun.pop()
            runner.waited_s += waited
            runner.deadline += waited
            if service is not None:
                service.deadline = runner.deadline
        if runner.waited_path:
            with contextlib.suppress(OSError):
                tmp = runner.waited_path + ".tmp"
                Path(tmp).write_text(f"{runner.waited_s:.3f} {'-' if since is None else f'{since:.3f}'}")
                os.replace(tmp, runner.waited_path)

    lane.on_wait = tell
    return lane


@contextlib.contextmanager
def _lane(
    phase_times: dict[str, tuple[float, float]], lane: DeviceLane | None, name: str = "device"
) -> Iterator[None]:
    """Record when the job held its device's lane (``phase_times[name]``, less the ``lane_released_<i>``
    intervals it gave the lane up for a compile)."""
    entered = time.time()
    try:
        yield
    finally:
        phase_times[name] = (entered, time.time())
        if lane is not None:
            phase_times.update(lane.phase_times())


def _execute(job: EvalJob, runner_pid_file: str | None = None) -> JobResult:
    if job.kind == "compile":  # no device lane, no trials: the candidate's programs compiled
        from kfoundry.core.evaluation.compile_discovery import execute_compile_job

        return execute_compile_job(job, runner_pid_file)
    start = _clock_ns()
    deadline = time.monotonic() + job.evaluation.timeout_s
    _strict_fp32()
    if job.threads:
        torch.set_num_threads(job.threads)
    runner = fork_runner(job, deadline)
    if runner_pid_file:
        runner.waited_path = runner_pid_file.removesuffix(".runner") + ".waited"
        with contextlib.suppress(OSError), open(runner_pid_file, "w") as handle:
            handle.write(str(runner.pid))
    judge: Judge | None = None
    built: dict[str, Any] = {}
    started = time.time()
    phase_times: dict[str, tuple[float, float]] = {}
    services: list[CompileService | None] = []
    try:
        try:
            problem = load_problem(job.problem_path, job.shapes)
            plan = (
                plan_trials(problem)
                if job.kind == "evaluate"
                else TrialPlan([dict(problem.shapes)], None, [])
            )
            plan = _limit_variants(plan, job.evaluation.shape_variants)
        except KfError as exc:
            return JobResult(outcome=Outcome.runtime_error, message=f"setup: {exc}")
        judge, built = _start(job, runner, plan, services, phase_times)
        judge.check_native("after build")
        compile_s = float(built.get("compile_s") or 0.0)
        judge.phase("start and build")
        phase_times["build"] = (started, time.time())
        lane = _waits_off_the_clock(
            DeviceLane(lane_lock_path(job)), runner, services[0] if services else None
        )
        if services and services[0] is not None:
            services[0].lane = lane  # a cache-miss compile in the correctness trials gives the lane up
        with lane, _lane(phase_times, lane):  # the device's lane: check and time
            judge.phase("waiting for the device")
            if job.kind == "reference":
                lane.releasable = False
                timing, calls, _ = time_candidate(judge, verify=False)
                judge.phase("timing")
                result = JobResult(outcome=Outcome.correct, message="reference timed", timing=timing)
            else:
                summary = run_correctness(judge, plan)
                judge.check_native("after the correctness trials")
                judge.phase("correctness")
                lane.releasable = False  # timing: a compile stays inside the lane, on the candidate's clock
                timing, calls, verified = time_candidate(judge, verify=True)
                judge.check_native("after timing")
                judge.phase("timing")
                result = JobResult(
                    outcome=Outcome.correct,
                    timing=timing,
                    compile_time_s=compile_s,
                    message=f"{summary}; {calls} timed calls on fresh inputs, {verified} of them verified",
                )
    except JobFailed as failed:
        result = failed.result
        if built.get("ok"):
            result.compile_time_s = float(built.get("compile_s") or 0.0)
    except Exception as exc:
        import traceback

        result = JobResult(
            outcome=Outcome.runtime_error,
            message=f"judge: {type(exc).__name__}: {exc}",
            log=traceback.format_exc()[-4000:],
        )
    finally:
        runner.kill()
        if judge is not None and judge.arena is not None:
            judge.arena.close()
        if judge is not None and judge.shared is not None:
            with contextlib.suppress(Exception):
                judge.shared.close()
    if judge is not None:
        result.sandbox, result.sandbox_notes = judge.sandbox, judge.sandbox_notes
        if result.timing is not None and judge.clock_used in ("events", "judge"):
            result.clock = "events" if judge.clock_used == "events" else "judge"
    if isinstance(built.get("resources"), dict):
        result.resources = built["resources"]
    if judge is not None and judge.clock_disagreements:
        judge.log.append(
            f"device clock not confirmed by the judge's clock ({judge.clock_disagreements}x): "
            "the judge's clock counted ("
            + "; ".join(judge.disagreement_samples)
            + f"; exchange overhead {judge.exchange_ms} ms, timer overhead {judge.timer_overhead_ms} ms)"
        )
    if judge is not None and judge.clock_pairs:
        ratios = sorted(c / e for e, c in judge.clock_pairs)
        judge.log.append(
            f"judge's clock net of overheads / device events over {len(ratios)} batches: median "
            f"{ratios[len(ratios) // 2]:.4f}, range {ratios[0]:.4f}-{ratios[-1]:.4f}"
        )
    if judge is not None and judge.phases:
        judge.log.append("judge phases: " + ", ".join(f"{name} {secs:.2f} s" for name, secs in judge.phases))
    parts = (
        ([*judge.log] if judge else [])
        + ([str(built.get("log"))] if built.get("log") else [])
        + ([result.log] if result.log else [])
    )
    result.log = "\n".join(p for p in parts if p)[-12000:]
    result.phase_times = phase_times
    service = services[0] if services else None
    if service is not None:
        result.compiles = service.records
        result.log = (service.summary() + "\n" + result.log)[-12000:]
    result.wall_s = (_clock_ns() - start) / 1e9
    return result
