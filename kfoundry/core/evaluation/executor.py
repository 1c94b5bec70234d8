"""The executor contract (plugin kind ``executor``): run evaluation jobs, each in a sandbox.

An executor plugin registers a factory returning an :class:`Executor`. The :class:`Evaluator` hands it
a list of :class:`~kfoundry.core.evaluation.jobs.EvalJob` and gets back one
:class:`~kfoundry.core.evaluation.jobs.JobResult` per job, in the same order. A job's own failure
(crash, hang, out of memory) is a result, never an exception: run each job through
:func:`kfoundry.core.evaluation.sandbox.run_sandboxed` (on whatever machine runs it), which turns
every failure into a typed outcome. Executors may run jobs concurrently; the sandbox serialises the
timing phase per device through ``EvalJob.lock_path``. :meth:`Executor.run_iter` yields results as
they finish (the default runs the whole batch first); callers iterate it in the driver's thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

from kfoundry.core.evaluation.jobs import EvalJob, JobResult


class Executor(ABC):
    """Runs evaluation jobs; see the module docstring for the contract."""

    @abstractmethod
    def run(self, jobs: list[EvalJob]) -> list[JobResult]:
        """Run every job in a sandbox; results in job order; never raise for one job's failure."""

    @property
    def parallelism(self) -> int:
        """Jobs this executor runs at once (callers size their batches by it)."""
        return 1

    def run_iter(self, jobs: list[EvalJob]) -> Iterator[tuple[int, JobResult]]:
        """``(job index, result)`` pairs as jobs finish (default: all of :meth:`run`, in order)."""
        yield from enumerate(self.run(jobs))

    def close(self) -> None:  # noqa: B027 - optional hook, default does nothing
        """Release workers (default: nothing to do)."""
