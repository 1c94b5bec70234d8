"""The device lane: a job's correctness trials and timing run under its device's lock (one lane per
physical device), its build outside it, so builds of other jobs overlap a benchmark but benchmarks
never overlap each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from eval_helpers import EXAMPLES, fast_config

from kfoundry.core.evaluation import EvalJob
from kfoundry.core.evaluation.compile_lane import DeviceLane
from kfoundry.core.evaluation.jobs import device_lane, lane_lock_path
from kfoundry.core.models import Candidate, Outcome
from kfoundry.plugins.executors.local import LocalExecutor, LocalOptions

needs_pyopencl = pytest.mark.skipif(
    __import__("importlib").util.find_spec("pyopencl") is None,
    reason="pyopencl is not installed (the jobs run on PoCL)",
)


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


#: The honest kernel built lazily on the first call (as the offline generator's recipes do, per shape).
LAZY = (
    (EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py")
    .read_text()
    .replace("        self.k = load(SRC, defines=PARAMS)\n", "        self.k = {}\n")
    .replace(
        "        c = torch.empty_like(a)\n",
        "        if a.numel() not in self.k:\n"
        "            self.k[a.numel()] = load(SRC, defines={**PARAMS, 'N_AT': a.numel()})\n"
        "        c = torch.empty_like(a)\n",
    )
    .replace("self.k.vector_add(", "self.k[a.numel()].vector_add(")
)


def _held(result: Any) -> list[tuple[float, float]]:
    """The intervals a job held its lane: ``device`` less its ``lane_released_<i>`` intervals."""
    start, end = result.phase_times["device"]
    gaps = sorted(v for k, v in result.phase_times.items() if k.startswith("lane_released_"))
    held, at = [], start
    for a, b in gaps:
        held.append((at, a))
        at = b
    return [*held, (at, end)]


@needs_pyopencl
def test_loads_inside_forward_compile_in_the_service_with_the_lane_given_up(tmp_path: Path) -> None:
    config = fast_config(trials=2)
    jobs = [
        EvalJob(
            problem_path=str(EXAMPLES / "kernelbench" / "vector_add.py"),
            shapes={"N": 1024},
            candidate=Candidate(source=LAZY.replace("load(SRC", f"load('// {i}\\n' + SRC")),
            evaluation=config.evaluation,
            backend_plugin="opencl",
            lock_path=str(tmp_path / "bench.lock"),
            compile_cache_dir=str(tmp_path / "cache"),
        )
        for i in range(2)
    ]
    results = LocalExecutor(LocalOptions(workers=2)).run(jobs)
    assert all(r.outcome is Outcome.correct for r in results), [r.message for r in results]
    for r in results:
        # every shape set's program was a load inside forward: all compiled by the judge, none cached,
        # each with the lane released for the compile (the correctness trials)
        assert r.compiles and all(not c["cached"] and c["lane_released_s"] > 0 for c in r.compiles), (
            r.compiles
        )
        assert sum(k.startswith("lane_released_") for k in r.phase_times) == len(r.compiles)
    for a in _held(results[0]):
        for b in _held(results[1]):
            assert not (a[0] < b[1] and b[0] < a[1]), (a, b)  # held lanes never overlap
    again = LocalExecutor().run(jobs[:1])[0]  # the same candidate again: its forward's loads are cached
    assert again.outcome is Outcome.correct and again.compiles
    assert all(c["cached"] and "lane_released_s" not in c for c in again.compiles), again.compiles
    assert not any(k.startswith("lane_released_") for k in again.phase_times)


def test_the_lane_is_given_up_for_a_compile_except_while_timing(tmp_path: Path) -> None:
    import fcntl

    path = str(tmp_path / "lane.lock")

    def free() -> bool:
        with open(path, "a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(other, fcntl.LOCK_UN)
            return True

    with DeviceLane(path) as lane:
        assert lane.held and not free()
        with lane.released_for_compile() as released:
            assert released and free()
        assert not free() and len(lane.released) == 1
        lane.releasable = False  # timing: the compile stays inside the lane
        with lane.released_for_compile() as released:
            assert not released and not free()
    assert free() and list(lane.phase_times()) == ["lane_released_0"]
    with DeviceLane(None) as nothing, nothing.released_for_compile() as released:
        assert not released


@needs_pyopencl
def test_waiting_for_the_lane_is_not_counted_against_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job queued behind one that holds the device (a hanging candidate, up to its own timeout) is
    not timed out for the wait: its deadline, and the sandbox's, start again when it gets the lane."""
    import fcntl
    import threading
    import time

    from kfoundry.core.evaluation import sandbox

    monkeypatch.setattr(sandbox, "JUDGE_GRACE_S", 1.0)  # the sandbox's own limit: 6 s + 1 s
    config = fast_config(trials=2)
    evaluation = config.evaluation.model_copy(update={"timeout_s": 6.0})
    job = EvalJob(
        problem_path=str(EXAMPLES / "kernelbench" / "vector_add.py"),
        shapes={"N": 1024},
        candidate=Candidate(source=(EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py").read_text()),
        evaluation=evaluation,
        backend_plugin="opencl",
        lock_path=str(tmp_path / "bench.lock"),
    )
    held = threading.Event()

    def hold_the_lane() -> None:  # another job's turn on the device: 10 s, longer than the timeout
        with open(tmp_path / "bench-dev0.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held.set()
            time.sleep(10.0)

    holder = threading.Thread(target=hold_the_lane)
    holder.start()
    held.wait(5)
    submitted = time.time()
    (result,) = LocalExecutor(LocalOptions(workers=1)).run([job])
    holder.join()
    assert result.outcome is Outcome.correct, result.message
    # it took the lane only when the other job let go, 10 s in: past its 6 s timeout and the sandbox's 7 s
    assert result.phase_times["device"][0] - submitted > 9.0, result.phase_times
