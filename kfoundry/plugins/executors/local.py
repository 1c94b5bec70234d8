"""The ``local`` executor: jobs run in sandboxed child processes on this machine, ``workers`` at once.

Each job gets a fresh child (see :mod:`kfoundry.core.evaluation.sandbox`), with ``workers > 1`` capped at
its share of the cores (``EvalJob.threads``: torch's and PoCL's thread pools); the timing phase of
concurrent jobs is serialised per device by the sandbox's lock, so ``workers > 1`` overlaps
compilation and correctness checks without letting benchmarks disturb each other. Results come back
as they finish (:meth:`LocalExecutor.run_iter`); a caller that stops iterating cancels the jobs not
yet started. A job that raises instead of returning (a bug in the
machinery, never the candidate's failure) becomes a ``runtime_error`` result.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from pydantic import BaseModel, ConfigDict, Field

from kfoundry import hookimpl
from kfoundry.core.evaluation.executor import Executor
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.evaluation.sandbox import run_sandboxed
from kfoundry.core.hookspecs import Register
from kfoundry.core.models import Outcome


class LocalOptions(BaseModel):
    """Options of the local executor."""

    model_config = ConfigDict(extra="forbid")

    workers: int = Field(default=1, ge=1, le=256, description="jobs run at once")
    devices: list[int] = Field(
        default_factory=list,
        description="device indices (of one model) to spread jobs over, one benchmark lane each, e.g. "
        "[0, 1, 2, 3] on a host with four GPUs; empty: the configured backend.device",
    )


def _result_of(future: Future[JobResult]) -> JobResult:
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - the contract: one job's failure is a result
        return JobResult(outcome=Outcome.runtime_error, message=f"setup: the executor failed: {exc}"[:500])


class LocalExecutor(Executor):
    """Sandboxed local worker processes (see module docstring)."""

    def __init__(self, options: LocalOptions | None = None) -> None:
        self.options = options or LocalOptions()

    @property
    def parallelism(self) -> int:
        return self.options.workers

    def run(self, jobs: list[EvalJob]) -> list[JobResult]:
        results: list[JobResult | None] = [None] * len(jobs)
        for i, result in self.run_iter(jobs):
            results[i] = result
        return [r for r in results if r is not None]

    def run_iter(self, jobs: list[EvalJob]) -> Iterator[tuple[int, JobResult]]:
        jobs = spread(jobs, self.options.devices)
        if self.options.workers == 1 or len(jobs) <= 1:
            for i, job in enumerate(jobs):
                yield i, run_sandboxed(job)
            return
        share = max(1, (os.cpu_count() or 1) // self.options.workers)
        jobs = [job if job.threads else job.model_copy(update={"threads": share}) for job in jobs]
        pool = ThreadPoolExecutor(max_workers=min(self.options.workers, len(jobs)))
        try:
            futures = {pool.submit(run_sandboxed, job): i for i, job in enumerate(jobs)}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=futures.__getitem__):
                    yield futures[future], _result_of(future)
        finally:  # the caller stopped early (a budget): jobs not started never start
            pool.shutdown(wait=True, cancel_futures=True)


def spread(jobs: list[EvalJob], devices: list[int]) -> list[EvalJob]:
    """Jobs assigned round-robin to ``devices`` (each device has its own lane; none: unchanged)."""
    if not devices:
        return jobs
    return [job.model_copy(update={"device": devices[i % len(devices)]}) for i, job in enumerate(jobs)]


@hookimpl
def kf_register_executors(register: Register) -> None:
    register(
        "local", LocalExecutor, options=LocalOptions, description="sandboxed worker processes on this machine"
    )
