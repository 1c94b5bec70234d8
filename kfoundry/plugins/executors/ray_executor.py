"""The ``ray`` executor: jobs run as Ray tasks, each still inside the sandbox on the worker machine.

Needs the optional extra (``pip install 'kfoundry[ray]'``); ray is imported only when this executor
is built, and a missing ray is a one-line error. Jobs for GPU backends ask Ray for
``gpus_per_job`` GPUs so at most one benchmark runs per device; compile-heavy work spreads over CPUs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kfoundry import hookimpl
from kfoundry.core.errors import KfError
from kfoundry.core.evaluation.executor import Executor
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.hookspecs import Register


class RayOptions(BaseModel):
    """Options of the Ray executor."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        default=None, description="Ray cluster address (None: start or join a local one)"
    )
    cpus_per_job: float = Field(default=1.0, gt=0)
    gpus_per_job: float = Field(default=0.0, ge=0, description="GPUs each job reserves (1 for GPU backends)")


def _sandboxed(job_json: str) -> str:
    from kfoundry.core.evaluation.sandbox import run_sandboxed

    return run_sandboxed(EvalJob.model_validate_json(job_json)).model_dump_json()


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
            ray.init(address=self.options.address, ignore_reinit_error=True, log_to_driver=False)
        self._task = ray.remote(num_cpus=self.options.cpus_per_job, num_gpus=self.options.gpus_per_job)(
            _sandboxed
        )

    def run(self, jobs: list[EvalJob]) -> list[JobResult]:
        refs = [self._task.remote(job.model_dump_json()) for job in jobs]
        return [JobResult.model_validate_json(text) for text in self._ray.get(refs)]

    def close(self) -> None:
        """Leave the Ray runtime running for other users of this process."""


@hookimpl
def kf_register_executors(register: Register) -> None:
    register("ray", RayExecutor, options=RayOptions, description="Ray tasks across machines (optional extra)")
