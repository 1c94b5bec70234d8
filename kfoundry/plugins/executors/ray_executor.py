"""The ``ray`` executor: jobs run as Ray tasks, each still inside the sandbox on the worker machine.

Needs the optional extra (``pip install 'kfoundry[ray]'``); ray is imported only when this executor
is built, and a missing ray is a one-line error. See ``docs/distributed.md``.

- Jobs carry the problem's source text (``EvalJob.problem_source``, read here on the driver), so the
  workers need the installed package and nothing else: no shared file system, no checkout. (A native
  ``.toml`` task names a reference file next to it: those jobs keep the path and need the files.)
- Tasks ask for ``cpus_per_job`` CPUs, and for a GPU (``num_gpus``) when the backend is ``cuda``
  (``gpus_per_job``, default 1 there, 0 elsewhere), so at most one benchmark runs per device; a GPU
  task also asks for ``device_resources`` (a custom resource per device kind), a CPU one for
  ``cpu_resources``. A GPU task runs on device 0 of what Ray made visible to it.
- No more tasks are in flight than the cluster has room for, so a task runs as soon as it is
  submitted; one that has not answered ``task_timeout_s`` after submission is cancelled and is a
  ``timeout``. Results come back as they finish (``ray.wait``); only the driver writes the store.
- ``compile_tasks``: each candidate is first a CPU task (``cpu_resources``; no GPU) that compiles its
  programs through the judge's compile service without running them (a ``compile`` job,
  ``compile_discovery.py``); its benchmark task then carries the artefacts and its judge serves them
  instead of compiling (``JobResult.compiles`` marks them ``seeded``). A compile task that fails or
  times out leaves the benchmark task to compile as usual.
- A task whose worker process or node dies (an infrastructure failure, never the candidate's compile
  error or crash, which the sandbox turns into a result) is submitted again, at most ``max_retries``
  times; the retries are written into the job's log and ``resources["ray_retries"]``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kfoundry import hookimpl
from kfoundry.core.errors import KfError
from kfoundry.core.evaluation.executor import Executor
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.hookspecs import Register
from kfoundry.core.models import Outcome

#: Ray's exceptions that mean the machinery failed (retried), by class name.
INFRASTRUCTURE = (
    "WorkerCrashedError",
    "NodeDiedError",
    "ObjectLostError",
    "OwnerDiedError",
    "LocalRayletDiedError",
    "RaySystemError",
    "OutOfMemoryError",
    "TaskUnschedulableError",
    "ObjectFetchTimedOutError",
)


class RayOptions(BaseModel):
    """Options of the Ray executor."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        default=None,
        description="Ray cluster address, e.g. 10.0.0.5:6379 (None: join a running local one or start one)",
    )
    cpus_per_job: float = Field(default=1.0, gt=0, description="CPUs each task reserves")
    gpus_per_job: float | None = Field(
        default=None, ge=0, description="GPUs each task reserves (None: 1 for the cuda backend, else 0)"
    )
    device_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources a GPU job (the device lane) asks for besides num_gpus, e.g. "
        "{kf_device_cuda_sm90 = 1} for nodes started with --resources='{\"kf_device_cuda_sm90\": 8}'",
    )
    cpu_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources a job without a GPU asks for (e.g. {kf_compile = 1})",
    )
    task_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="a task not answered this long after submission is cancelled (timeout)",
    )
    compile_tasks: bool = Field(
        default=False,
        description="compile each candidate in a CPU task first (no device needed), then benchmark it "
        "with the artefacts (see docs/distributed.md)",
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        le=20,
        description="resubmissions of a task whose worker or node died (not its candidate)",
    )


def _sandboxed(job_json: str) -> str:
    from kfoundry.core.evaluation.sandbox import run_sandboxed

    return run_sandboxed(EvalJob.model_validate_json(job_json)).model_dump_json()


def portable(job: EvalJob, texts: dict[str, str] | None = None) -> EvalJob:
    """``job`` with its problem's text attached (KernelBench ``.py`` problems), so any machine can run
    it; ``texts`` caches what was read (path -> text)."""
    if job.problem_source is not None or not job.problem_path.endswith(".py"):
        return job
    texts = {} if texts is None else texts
    if job.problem_path not in texts:
        try:
            texts[job.problem_path] = Path(job.problem_path).read_text()
        except OSError as exc:
            raise KfError(f"cannot read the problem {job.problem_path}: {exc.strerror}") from None
    return job.model_copy(update={"problem_source": texts[job.problem_path]})


class RayExecutor(Executor):
    """Ray tasks, each running one sandboxed job (see module docstring)."""

    def __init__(self, options: RayOptions | None = None) -> None:
        self.options = options or RayOptions()
        try:
            import ray
        except ImportError:
            raise KfError("the ray executor needs Ray: pip install 'kfoundry[ray]'") from None
        self._ray: Any = ray
        if not ray.is_initialized():
            try:
                ray.init(address=self.options.address, ignore_reinit_error=True, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = self.options.address or "a local cluster"
                raise KfError(
                    f"executor.options.address: cannot join Ray at {where}: {exc}".splitlines()[0]
                ) from None
        self._task = ray.remote(max_retries=0)(_sandboxed)
        self._texts: dict[str, str] = {}

    def run(self, jobs: list[EvalJob]) -> list[JobResult]:
        results: list[JobResult | None] = [None] * len(jobs)
        for i, result in self.run_iter(jobs):
            results[i] = result
        return [r for r in results if r is not None]

    @property
    def parallelism(self) -> int:
        return self._room()

    def _room(self) -> int:
        """Tasks the cluster can run at once (its CPUs over ``cpus_per_job``; at least one)."""
        cpus = float(self._ray.cluster_resources().get("CPU", 1.0))
        return max(1, int(cpus // self.options.cpus_per_job))

    def _submit(self, job: EvalJob) -> Any:
        gpus = self.options.gpus_per_job
        if gpus is None:
            gpus = 1.0 if job.on_gpu or job.backend == "cuda" else 0.0
        if job.kind == "compile":
            gpus = 0.0
        custom = self.options.device_resources if gpus > 0 else self.options.cpu_resources
        task = self._task.options(
            num_cpus=self.options.cpus_per_job, num_gpus=gpus, resources=dict(custom) or None
        )
        if job.threads is None:  # the job's thread pools sized to the CPUs its task reserves
            job = job.model_copy(update={"threads": max(1, int(self.options.cpus_per_job))})
        if gpus > 0 and job.backend == "cuda" and isinstance(job.device, int):
            # Ray gives the task its GPU as CUDA_VISIBLE_DEVICES: device 0 there (the lane lock maps it back)
            job = job.model_copy(update={"device": 0})
        return task.remote(job.model_dump_json())

    def run_iter(self, jobs: list[EvalJob]) -> Iterator[tuple[int, JobResult]]:
        ray, opts = self._ray, self.options
        shipped = [portable(job, self._texts) for job in jobs]
        compiling = {i for i, job in enumerate(shipped) if opts.compile_tasks and job.kind == "evaluate"}
        for i in compiling:  # first a CPU task that compiles; the benchmark job follows (``_compiled``)
            shipped[i] = shipped[i].model_copy(update={"kind": "compile"})
        queue = list(range(len(jobs)))
        attempts = dict.fromkeys(queue, 0)
        failures: dict[int, list[str]] = {i: [] for i in queue}
        notes: dict[int, list[str]] = {i: [] for i in queue}
        flying: dict[Any, tuple[int, float]] = {}
        try:
            while queue or flying:
                room = self._room()
                while queue and len(flying) < room:
                    i = queue.pop(0)
                    attempts[i] += 1
                    flying[self._submit(shipped[i])] = (i, time.monotonic())
                ready, _ = ray.wait(list(flying), num_returns=1, timeout=1.0)
                for ref in ready:
                    i, _ = flying.pop(ref)
                    result, why = self._collect(ref)
                    if i in compiling and (result is not None or attempts[i] > opts.max_retries):
                        shipped[i] = _compiled(jobs[i], shipped[i], result, why, notes[i])
                        compiling.discard(i)
                        attempts[i] = 0
                        queue.insert(0, i)  # its benchmark task, next
                        continue
                    if result is None and attempts[i] <= opts.max_retries:
                        failures[i].append(why)
                        queue.insert(0, i)  # again, on whichever node has room now
                        continue
                    if result is None:
                        failures[i].append(why)
                        result = JobResult(
                            outcome=Outcome.runtime_error,
                            message=(f"setup: the ray task failed {attempts[i]} times: {why}")[:500],
                        )
                    yield i, _noted(result, failures[i], notes[i])
                now = time.monotonic()
                for ref, (i, since) in list(flying.items()):
                    if now - since > opts.task_timeout_s:
                        del flying[ref]
                        ray.cancel(ref, force=True)
                        if i in compiling:  # the benchmark task compiles for itself
                            shipped[i] = _compiled(jobs[i], shipped[i], None, "timed out", notes[i])
                            compiling.discard(i)
                            attempts[i] = 0
                            queue.insert(0, i)
                            continue
                        yield (
                            i,
                            _noted(
                                JobResult(
                                    outcome=Outcome.timeout,
                                    message=(
                                        f"timed out: the ray task gave no answer in {opts.task_timeout_s:g} s (cancelled)"
                                    ),
                                ),
                                failures[i],
                                notes[i],
                            ),
                        )
        finally:  # the caller stopped early: nothing left running on the cluster for it
            for ref in flying:
                ray.cancel(ref, force=True)

    def _collect(self, ref: Any) -> tuple[JobResult | None, str]:
        """The task's result, or None and why when its worker or node died (to be retried)."""
        try:
            return JobResult.model_validate_json(self._ray.get(ref)), ""
        except Exception as exc:  # noqa: BLE001 - sorted into infrastructure (retried) and the rest
            name = type(exc).__name__
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            if any(kind in name for kind in INFRASTRUCTURE):
                return None, f"{name}: {first}"
            return JobResult(
                outcome=Outcome.runtime_error, message=f"setup: the ray task raised {name}: {first}"
            ), ""

    def close(self) -> None:
        """Leave the Ray runtime running for other users of this process."""


def _compiled(
    job: EvalJob, shipped: EvalJob, result: JobResult | None, why: str, notes: list[str]
) -> EvalJob:
    """The benchmark job after its compile task: with the artefacts it shipped (none if it failed)."""
    if result is None:
        notes.append(f"ray: compile task failed ({why}); the benchmark task compiles")
        return shipped.model_copy(update={"kind": job.kind})
    notes.append(f"ray: compile task: {result.message[:300]} ({result.wall_s:.2f} s)")
    return shipped.model_copy(update={"kind": job.kind, "seed_artifacts": dict(result.artifacts)})


def _noted(result: JobResult, failures: list[str], notes: list[str] | None = None) -> JobResult:
    """``result`` with the infrastructure failures that preceded it (and the compile task's note) in
    its log and resources."""
    if failures:
        result.resources = {**result.resources, "ray_retries": len(failures)}
    lines = [f"ray: attempt {n} failed: {why}" for n, why in enumerate(failures, 1)] + list(notes or [])
    if lines:
        result.log = "\n".join([*lines, result.log]).strip()
    return result


@hookimpl
def kf_register_executors(register: Register) -> None:
    register("ray", RayExecutor, options=RayOptions, description="Ray tasks across machines (optional extra)")
