"""Jobs run side by side share the cores: the local executor gives each its share (EvalJob.threads) and
the runner caps torch's and PoCL's thread pools at it (issue 11: two workers oversubscribed two cores)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.models import Outcome
from kfoundry.plugins.executors import local
from kfoundry.plugins.executors.local import LocalExecutor, LocalOptions


def test_each_concurrent_job_gets_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int | None] = []

    def fake(job: EvalJob) -> JobResult:
        seen.append(job.threads)
        return JobResult(outcome=Outcome.correct)

    monkeypatch.setattr(local, "run_sandboxed", fake)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    jobs = [EvalJob(problem_path="p.py") for _ in range(4)]
    list(LocalExecutor(LocalOptions(workers=2)).run_iter(jobs))
    assert seen == [4, 4, 4, 4]
    seen.clear()
    list(LocalExecutor(LocalOptions(workers=1)).run_iter(jobs))  # one at a time: all the cores
    assert seen == [None] * 4
    seen.clear()
    list(
        LocalExecutor(LocalOptions(workers=16)).run_iter([j.model_copy(update={"threads": 3}) for j in jobs])
    )
    assert seen == [3] * 4  # a job's own setting stays


def test_the_runner_caps_torch_and_pocl_threads() -> None:
    code = (
        "import os, torch; from kfoundry.core.evaluation.runner_calls import cap_threads; cap_threads(1); "
        "print(torch.get_num_threads(), os.environ['POCL_MAX_PTHREAD_COUNT'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["1", "1"]
