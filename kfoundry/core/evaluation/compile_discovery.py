"""Compile jobs: a candidate's programs compiled on a machine that need not have its device.

A ``compile`` job (:class:`~.jobs.EvalJob` ``kind="compile"``) runs the candidate's build in the
sandboxed runner as an evaluation does, then calls its ``forward`` once per shape set on host inputs,
so the loads it makes there (a program per shape, as the offline generator's lazy recipes do) are
asked for too. Every load goes to the judge's compile service (:mod:`.compile_service`: the judge
computes the key, compiles in its confined child, keeps a copy); the runner gets back a module whose
kernels do not run (``forward`` stops at its first launch, which is expected: only the requests
matter). The job's result carries the artefacts (:attr:`~.jobs.JobResult.artifacts`); the benchmark
job of the same candidate gets them as :attr:`~.jobs.EvalJob.seed_artifacts`, and its judge serves a
request whose key (inputs, toolchain, target: the same computation) is among them without compiling.

Where the backend's artefacts need no device (CUDA, HIP: ``artifacts_need_device = False``), the
runner compiles for the device the driver saw (:attr:`~.jobs.EvalJob.device_profile`: its compute
capability is the target), with the model and inputs on the host; elsewhere (OpenCL) it selects its
own device as usual, and the keys match the benchmark's only where the devices are the same.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from kfoundry.core.backend import Backend, KernelModule
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.models import Outcome

#: The most artefact bytes (packed, before base64) a compile job hands back.
MAX_SHIPPED = 32 << 20


def device_free(job: EvalJob, backend: Backend) -> bool:
    """Whether a compile job's runner compiles for ``job.device_profile`` without selecting a device."""
    return (
        job.kind == "compile"
        and job.device_profile is not None
        and getattr(backend, "artifacts_need_device", True) is False
    )


def unrunnable_module(meta: dict[str, Any]) -> KernelModule:
    """What a compile job's load returns: the program's kernels, each refusing to run."""
    from kfoundry.plugins.backends.toolchain import unrunnable_kernel

    names = [str(k) for k in meta.get("kernels") or []]
    message = "a compile job's kernels do not run (the benchmark job runs them)"
    return KernelModule({name: unrunnable_kernel(message) for name in names}, log=str(meta.get("log", "")))


def discover_calls(runner: Any) -> dict[str, Any]:
    """The runner's ``discover`` command: ``forward`` once per built shape set, on host inputs, so its
    loads are asked for; a failure after them (the first launch) is expected and noted."""
    notes: list[str] = []
    calls = 0
    for v, model in enumerate(runner.models):
        if model is None:
            continue
        calls += 1
        try:
            with torch.no_grad():
                model(*runner.problems[v].make_inputs(0, "cpu"))
        except Exception as exc:  # the first launch of a kernel that does not run here, typically
            notes.append(f"variant {v}: {type(exc).__name__}: {str(exc)[:200]}")
    return {"ok": True, "calls": calls, "notes": notes[:20]}


def run_compile_job(job: EvalJob, runner: Any, variants: list[dict[str, Any]]) -> JobResult:
    """The judge's side of a compile job: setup, build and discovery through the compile service."""
    from kfoundry.core.evaluation.compile_service import CompileService, build_with_service
    from kfoundry.core.evaluation.runner_handle import JobFailed

    try:
        runner.chan.send({"variants": variants, "uid": 3_000_000 + runner.pid % 1_000_000})
        ready = runner.receive()
        if ready.get("op") != "ready":
            return JobResult(
                outcome=Outcome.runtime_error, message=f"setup: {ready.get('error', 'no runner')}"
            )
        runner.freeze()
        service = CompileService.for_job(job, ready.get("compile"))
        if service is None:
            return JobResult(
                outcome=Outcome.runtime_error,
                message="compile job: no compile service here (compile_cache off or no toolchain for the backend)",
            )
        service.keep = True
        built = build_with_service(runner, service)
        notes: list[str] = []
        if built.get("ok") is True:
            found, _ = runner.exchange({"op": "discover"})
            notes = [str(n) for n in found.get("notes") or []][:20]
    except JobFailed as failed:
        return failed.result
    shipped = service.shipped(MAX_SHIPPED)
    errors = [r for r in service.records if "error" in r]
    outcome = Outcome.correct if built.get("ok") is True and not errors else Outcome.compile_error
    message = (
        f"compile job: {len(service.records)} program(s), {len(shipped)} artefact(s) shipped"
        + (f"; build: {str(built.get('error', ''))[:300]}" if built.get("ok") is not True else "")
        + (f"; {len(errors)} compile error(s)" if errors else "")
    )
    result = JobResult(outcome=outcome, message=message, compiles=service.records, artifacts=shipped)
    result.log = "\n".join([service.summary(), *notes])[-12000:]
    return result


def execute_compile_job(job: EvalJob, runner_pid_file: str | None = None) -> JobResult:
    """Fork the runner and run a compile job (no device lane: nothing runs on the device)."""
    import time

    from kfoundry.core.errors import KfError
    from kfoundry.core.evaluation.runner_handle import fork_runner
    from kfoundry.core.evaluation.trials import plan_trials
    from kfoundry.core.evaluation.worker import _limit_variants
    from kfoundry.core.problem import load_problem

    started = time.monotonic()
    try:
        problem = load_problem(job.problem_path, job.shapes)
        plan = _limit_variants(plan_trials(problem), job.evaluation.shape_variants)
    except KfError as exc:
        return JobResult(outcome=Outcome.runtime_error, message=f"setup: {exc}")
    runner = fork_runner(job, time.monotonic() + job.evaluation.timeout_s)
    if runner_pid_file:  # the sandbox kills the runner's tree with it
        with contextlib.suppress(OSError), open(runner_pid_file, "w") as handle:
            handle.write(str(runner.pid))
    try:
        result = run_compile_job(job, runner, plan.variants)
    finally:
        with contextlib.suppress(Exception):
            runner.kill()
    result.wall_s = time.monotonic() - started
    return result
