"""The device lane: a job's correctness trials and timing run under its device's lock (one lane per
physical device), its build outside it, so builds of other jobs overlap a benchmark but benchmarks
never overlap each other."""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_helpers import EXAMPLES, fast_config

from kfoundry.core.evaluation import EvalJob
from kfoundry.core.evaluation.jobs import device_lane, lane_lock_path
from kfoundry.core.models import Candidate, Outcome
from kfoundry.plugins.executors.local import LocalExecutor, LocalOptions


def test_one_lane_per_physical_device(monkeypatch: pytest.MonkeyPatch) -> None:
    job = EvalJob(problem_path="p.py", backend="cuda", device=0, lock_path="/tmp/kf-bench-abc.lock")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    paths = {lane_lock_path(job.model_copy(update={"device": i})) for i in range(8)}
    assert len(paths) == 8 and "/tmp/kf-bench-abc-dev3.lock" in paths
    # Ray gives each task its own GPU and renumbers it 0: the lane is the physical device
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    assert device_lane(job) == "5" and device_lane(job.model_copy(update={"device": 1})) == "7"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1a2b/../x")
    assert device_lane(job) == "GPU-1a2b_.._x"
    assert lane_lock_path(job.model_copy(update={"lock_path": None})) is None


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_benchmarks_never_overlap_while_builds_do(tmp_path: Path) -> None:
    # correctness trials long enough (0.6 s of extra trials) that overlapping lanes would show
    config = fast_config(trials=2, correctness_budget_s=0.6)
    source = (EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py").read_text()
    jobs = [
        EvalJob(
            problem_path=str(EXAMPLES / "kernelbench" / "vector_add.py"),
            shapes={"N": 1024},
            # distinct programs (a define each) so no runtime cache shares a build
            candidate=Candidate(source=source.replace("load(SRC", f"load('// {i}\\n' + SRC")),
            evaluation=config.evaluation,
            backend_plugin="opencl",
            lock_path=str(tmp_path / "bench.lock"),
        )
        for i in range(3)
    ]
    results = LocalExecutor(LocalOptions(workers=3)).run(jobs)
    assert all(r.outcome is Outcome.correct for r in results), [r.message for r in results]
    lanes = [r.phase_times["device"] for r in results]
    builds = [r.phase_times["build"] for r in results]
    for i in range(3):
        assert builds[i][1] <= lanes[i][0]
        for j in range(i + 1, 3):
            assert not _overlap(lanes[i], lanes[j]), (lanes[i], lanes[j])
    # the jobs started together: their builds ran side by side (outside the lane)
    assert any(_overlap(builds[i], builds[j]) for i in range(3) for j in range(i + 1, 3)), builds
    assert (tmp_path / "bench-dev0.lock").exists()


def test_local_executor_spreads_jobs_over_devices_one_lane_each() -> None:
    from kfoundry.plugins.executors.local import spread

    jobs = [EvalJob(problem_path="p.py", backend="cuda", lock_path="/tmp/kf-bench-h.lock") for _ in range(5)]
    spread_jobs = spread(jobs, [0, 1, 2, 3])
    assert [j.device for j in spread_jobs] == [0, 1, 2, 3, 0]
    assert len({lane_lock_path(j) for j in spread_jobs}) == 4
    assert spread(jobs, []) == jobs
