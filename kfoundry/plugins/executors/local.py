"""The ``local`` executor: jobs run in sandboxed child processes on this machine, ``workers`` at once.

Each job gets a fresh child (see :mod:`kfoundry.core.evaluation.sandbox`); the timing phase of
concurrent jobs is serialised per device by the sandbox's lock, so ``workers > 1`` overlaps
compilation and correctness checks without letting benchmarks disturb each other.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel, ConfigDict, Field

from kfoundry import hookimpl
from kfoundry.core.evaluation.executor import Executor
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.evaluation.sandbox import run_sandboxed
from kfoundry.core.hookspecs import Register


class LocalOptions(BaseModel):
    """Options of the local executor."""

    model_config = ConfigDict(extra="forbid")

    workers: int = Field(default=1, ge=1, le=256, description="jobs run at once")


class LocalExecutor(Executor):
    """Sandboxed local worker processes (see module docstring)."""

    def __init__(self, options: LocalOptions | None = None) -> None:
        self.options = options or LocalOptions()

    def run(self, jobs: list[EvalJob]) -> list[JobResult]:
        if self.options.workers == 1 or len(jobs) <= 1:
            return [run_sandboxed(job) for job in jobs]
        with ThreadPoolExecutor(max_workers=min(self.options.workers, len(jobs))) as pool:
            return list(pool.map(run_sandboxed, jobs))


@hookimpl
def kf_register_executors(register: Register) -> None:
    register("local", LocalExecutor, options=LocalOptions, description="sandboxed worker processes on this machine")
