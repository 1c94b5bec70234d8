"""The cascade inside the sandboxed worker process: build (compile) → correctness → timing.

:func:`execute` runs one :class:`EvalJob` in the current process and returns a :class:`JobResult`;
the sandbox (:mod:`.sandbox`) calls it in a fresh child process so the candidate can patch nothing
that outlives it.
"""

from __future__ import annotations

import contextlib
import fcntl
import traceback
from collections.abc import Iterator
from typing import Any

import torch

from kfoundry import runtime
from kfoundry.core.backend import Backend, CompileFailed, KernelModule
from kfoundry.core.errors import KfError
from kfoundry.core.evaluation.guard import ForwardGuard
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.evaluation.timer import _clock_ns, measure
from kfoundry.core.evaluation.verifier import Verdict, check_independence, check_trial
from kfoundry.core.models import Outcome
from kfoundry.core.problem import CandidateBuildError, Problem, as_tensor_list, load_problem

#: Most input copies rotated through while timing.
MAX_ROTATION = 512


class _Recorder:
    """Wraps a backend's ``load`` to keep every module the candidate compiles (logs, resources)."""

    def __init__(self, backend: Backend) -> None:
        self.modules: list[KernelModule] = []
        self._load = backend.load

    def __call__(self, source: str, **kwargs: Any) -> KernelModule:
        module = self._load(source, **kwargs)
        self.modules.append(module)
        return module


def _tb(exc: BaseException) -> str:
    """Traceback limited to the candidate's own frames where possible."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    own = [ln for ln in lines if "<candidate>" in ln or not ln.startswith("  File")]
    return "".join(own)[-4000:]


def build_backend(job: EvalJob) -> Backend:
    """The job's backend, by name through the plugin registry, with its device selected."""
    from kfoundry.core.plugins import get_plugin

    backend = get_plugin("backend", job.backend).build(job.backend_options)
    backend.select_device(job.device)
    return backend


def _clone(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _nbytes(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


@contextlib.contextmanager
def _device_lock(path: str | None) -> Iterator[None]:
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _time(
    model: Any, problem: Problem, job: EvalJob, backend: Backend, guard: ForwardGuard | None
) -> tuple[Any, list[list[Any]]]:
    """Timing stats of ``model`` over rotated input sets, and those input sets."""
    ev = job.evaluation
    base = problem.make_inputs(job.seeds[0] if job.seeds else 1, backend.torch_device)
    size = max(1, _nbytes(base))
    copies = max(1, min(MAX_ROTATION, -(-ev.rotate_bytes // size)))
    rotation = [base] + [_clone(base) for _ in range(copies - 1)]

    def call(i: int) -> object:
        return model(*rotation[i % copies])

    with _device_lock(job.lock_path), torch.no_grad(), (guard or contextlib.nullcontext()):
        stats = measure(
            call,
            backend.synchronize,
            warmup_s=ev.warmup_s,
            target_time_s=ev.target_time_s,
            min_repeats=ev.min_repeats,
            max_repeats=ev.max_repeats,
            device_timer=backend.device_timer(),
        )
    return stats, rotation


def _verify_after_timing(
    model: Any, reference: Any, inputs: list[Any], problem: Problem, job: EvalJob, backend: Backend
) -> Verdict | None:
    """Refill a timed input set in place (same memory, fresh values) and check the candidate once more.

    Catches results cached across calls (keyed by tensor address or call count) and kernels that
    behave differently once the correctness trials are over.
    """
    fresh = problem.make_inputs((job.seeds[-1] if job.seeds else 0) + 7919, backend.torch_device)
    for old, new in zip(inputs, fresh, strict=True):
        if isinstance(old, torch.Tensor):
            old.copy_(new)
    snapshots = _clone(inputs)
    with torch.no_grad():
        refs = as_tensor_list(reference(*_clone(inputs)))
        with ForwardGuard(poison_fresh=True) as guard:
            outs = as_tensor_list(model(*inputs))
        backend.synchronize()
    if guard.threads:
        return Verdict(Outcome.rejected, _threads_message(guard))
    return check_trial(outs, refs, inputs, snapshots, job.evaluation.atol, job.evaluation.rtol)


def _threads_message(guard: ForwardGuard) -> str:
    names = ", ".join(dict.fromkeys(guard.threads))
    return f"forward started a thread ({names}): work that can finish after the clock stops is not allowed"


def _reference_job(job: EvalJob, problem: Problem, backend: Backend) -> JobResult:
    model = problem.make_reference().to(backend.torch_device)
    timing, _ = _time(model, problem, job, backend, None)
    return JobResult(outcome=Outcome.correct, message="reference timed", timing=timing)


def _evaluate_job(job: EvalJob, problem: Problem, backend: Backend) -> JobResult:
    assert job.candidate is not None
    ev = job.evaluation
    recorder = _Recorder(backend)
    backend.load = recorder  # type: ignore[method-assign]
    start = _clock_ns()
    try:
        model = problem.build_candidate(job.candidate, runtime.load, seed=0).to(backend.torch_device)
    except CompileFailed as exc:
        return JobResult(outcome=Outcome.compile_error, message=str(exc), log=exc.log)
    except CandidateBuildError as exc:
        return JobResult(outcome=Outcome.compile_error, message=str(exc))
    except Exception as exc:
        return JobResult(outcome=Outcome.runtime_error, message=f"building ModelNew: {type(exc).__name__}: {exc}", log=_tb(exc))
    compile_s = (_clock_ns() - start) / 1e9
    log = "\n".join([f"trial input seeds: {job.seeds}"] + [m.log for m in recorder.modules if m.log])
    resources: dict[str, Any] = {}
    for m in recorder.modules:
        resources.update(m.resources)
    reference = problem.make_reference().to(backend.torch_device)
    first: tuple[list[Any], list[Any]] | None = None  # trial 0's outputs and references
    for trial, seed in enumerate(job.seeds):
        inputs = problem.make_inputs(seed, backend.torch_device)
        ref_inputs, snapshots = _clone(inputs), _clone(inputs)
        refs: list[Any] | None = None
        if trial % 2 == 0:  # both orders: the reference runs before the candidate, then after it
            with torch.no_grad():
                refs = as_tensor_list(reference(*ref_inputs))
        guard = ForwardGuard(poison_fresh=True)
        try:
            with torch.no_grad(), guard:
                outs = as_tensor_list(model(*inputs))
            backend.synchronize()
        except KfError as exc:
            return JobResult(outcome=Outcome.runtime_error, message=f"trial {trial}: {exc}", log=log,
                             compile_time_s=compile_s, resources=resources)
        except Exception as exc:
            return JobResult(outcome=Outcome.runtime_error, message=f"trial {trial}: {type(exc).__name__}: {exc}",
                             log=_tb(exc), compile_time_s=compile_s, resources=resources)
        if guard.forbidden:
            return JobResult(outcome=Outcome.rejected, compile_time_s=compile_s, resources=resources, log=log,
                             message=f"forward computes with torch ({', '.join(guard.forbidden)}): compute must run in a kernel")
        if guard.threads:
            return JobResult(outcome=Outcome.rejected, compile_time_s=compile_s, resources=resources, log=log,
                             message=f"trial {trial}: {_threads_message(guard)}")
        if refs is None:
            with torch.no_grad():
                refs = as_tensor_list(reference(*ref_inputs))
        verdict = check_trial(outs, refs, inputs, snapshots, ev.atol, ev.rtol)
        if verdict is not None:
            return JobResult(outcome=verdict.outcome, message=f"trial {trial}: {verdict.message}", log=log,
                             compile_time_s=compile_s, resources=resources)
        if first is None:
            first = (_clone(outs), refs)
            continue
        # each later trial against the first: one stored copy, however many trials
        verdict = check_independence([first[0], outs], [first[1], refs])
        if verdict is not None:
            return JobResult(outcome=verdict.outcome, message=f"trial {trial}: {verdict.message}", log=log,
                             compile_time_s=compile_s, resources=resources)
    for m in recorder.modules:  # kernels compiled lazily on the first forward report their resources too
        resources.update(m.resources)
    del first
    guard = ForwardGuard(poison_fresh=False)
    try:
        timing, rotation = _time(model, problem, job, backend, guard)
        verdict = _verify_after_timing(model, reference, rotation[0], problem, job, backend)
    except Exception as exc:
        return JobResult(outcome=Outcome.runtime_error, message=f"while timing: {type(exc).__name__}: {exc}",
                         log=_tb(exc), compile_time_s=compile_s, resources=resources)
    if guard.forbidden:
        return JobResult(outcome=Outcome.rejected, compile_time_s=compile_s, resources=resources, log=log,
                         message=f"forward computes with torch while timed ({', '.join(guard.forbidden)})")
    if guard.threads:
        return JobResult(outcome=Outcome.rejected, compile_time_s=compile_s, resources=resources, log=log,
                         message=f"while timed: {_threads_message(guard)}")
    if verdict is not None:
        return JobResult(outcome=Outcome.rejected, compile_time_s=compile_s, resources=resources, log=log,
                         message=f"wrong after timing (results cached or behaviour changed): {verdict.message}")
    return JobResult(outcome=Outcome.correct, message=f"correct on {len(job.seeds)} trials", log=log,
                     timing=timing, compile_time_s=compile_s, resources=resources)


def _strict_fp32() -> None:
    """fp32 means fp32: no TF32 in the reference's matmuls or cuDNN convolutions (torch's default for
    convolutions), so a strictly fp32 kernel is not judged against a lower-precision answer and the
    eager baseline is not flattered."""
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def execute(job: EvalJob) -> JobResult:
    """Run one job in this process (the sandbox calls this in a fresh child)."""
    start = _clock_ns()
    _strict_fp32()
    try:
        problem = load_problem(job.problem_path, job.shapes)
        backend = build_backend(job)
        runtime.set_backend(backend)
    except KfError as exc:
        return JobResult(outcome=Outcome.runtime_error, message=f"setup: {exc}")
    if job.kind == "reference":
        try:
            result = _reference_job(job, problem, backend)
        except Exception as exc:
            result = JobResult(outcome=Outcome.runtime_error, message=f"reference: {type(exc).__name__}: {exc}",
                               log=traceback.format_exc()[-4000:])
    else:
        result = _evaluate_job(job, problem, backend)
    result.wall_s = (_clock_ns() - start) / 1e9
    return result
