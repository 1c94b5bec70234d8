"""Executor plugins: the local pool keeps job order; Ray runs the same sandboxed jobs on a local cluster
(and says so in one line when it is not installed)."""

from __future__ import annotations

import importlib.util

import pytest
from eval_helpers import BAD, EXAMPLES, fast_config

from kfoundry.core.errors import KfError
from kfoundry.core.evaluation import EvalJob
from kfoundry.core.models import Candidate, Outcome
from kfoundry.core.plugins import get_plugin
from kfoundry.plugins.executors.local import LocalExecutor, LocalOptions


def test_local_executor_runs_jobs_concurrently_in_order() -> None:
    config = fast_config(trials=2)
    problem = str(EXAMPLES / "kernelbench" / "vector_add.py")
    sources = [
        BAD / "wrong_shape.py",
        EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py",
        BAD / "compile_error.py",
    ]
    jobs = [
        EvalJob(
            problem_path=problem,
            shapes={"N": 512},
            candidate=Candidate(source=p.read_text()),
            evaluation=config.evaluation,
            backend_plugin="opencl",
        )
        for p in sources
    ]
    results = LocalExecutor(LocalOptions(workers=3)).run(jobs)
    assert [r.outcome for r in results] == [Outcome.wrong_shape, Outcome.correct, Outcome.compile_error]
    assert results[1].timing is not None and results[1].wall_s > 0


def test_local_is_the_registered_default() -> None:
    executor = get_plugin("executor", "local").build({"workers": 2})
    assert isinstance(executor, LocalExecutor) and executor.options.workers == 2


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed")
def test_ray_executor_without_ray_is_a_clear_error() -> None:
    with pytest.raises(KfError, match=r"pip install 'kfoundry\[ray\]'"):
        get_plugin("executor", "ray").build({})


def test_worker_output_joins_the_log() -> None:
    seed = (EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py").read_text()
    source = seed.replace(
        "        c = torch.empty_like(a)",
        "        print('hello from the candidate')\n        c = torch.empty_like(a)",
    )
    job = EvalJob(
        problem_path=str(EXAMPLES / "kernelbench" / "vector_add.py"),
        shapes={"N": 256},
        candidate=Candidate(source=source),
        evaluation=fast_config(trials=1).evaluation,
        backend_plugin="opencl",
    )
    result = LocalExecutor().run([job])[0]
    assert result.outcome is Outcome.correct, result.message
    assert "hello from the candidate" in result.log and "trial input seeds: [" in result.log


def test_sandbox_server_restarts_after_dying() -> None:
    from kfoundry.core.evaluation import sandbox

    seed = (EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py").read_text()
    job = EvalJob(
        problem_path=str(EXAMPLES / "kernelbench" / "vector_add.py"),
        shapes={"N": 128},
        candidate=Candidate(source=seed),
        evaluation=fast_config(trials=1).evaluation,
        seeds=[3],
        backend_plugin="opencl",
    )
    assert sandbox.run_sandboxed(job).outcome is Outcome.correct
    proc = sandbox._server._proc
    assert proc is not None
    proc.kill()
    proc.wait()
    assert sandbox.run_sandboxed(job).outcome is Outcome.correct
    assert sandbox._server._proc is not proc


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'kfoundry[ray]')"
)
def test_ray_executor_runs_sandboxed_jobs_on_a_local_cluster() -> None:
    import ray

    config = fast_config(trials=2, timeout_s=20.0)
    problem = str(EXAMPLES / "kernelbench" / "vector_add.py")
    sources = [
        EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py",
        BAD / "crash.py",  # kills its sandbox, not the Ray worker
        BAD / "wrong_result.py",
        EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py",
    ]
    jobs = [
        EvalJob(
            problem_path=problem,
            shapes={"N": 512},
            candidate=Candidate(source=p.read_text()),
            evaluation=config.evaluation,
            seeds=[1, 2],
            backend_plugin="opencl",
        )
        for p in sources
    ]
    try:
        executor = get_plugin("executor", "ray").build({"cpus_per_job": 1})
        results = executor.run(jobs)
        executor.close()
    finally:
        ray.shutdown()
    assert [r.outcome for r in results] == [
        Outcome.correct,
        Outcome.runtime_error,
        Outcome.mismatch,
        Outcome.correct,
    ]
    assert "worker crashed" in results[1].message
    assert results[0].timing is not None and results[3].timing is not None


def test_a_job_carrying_its_problem_text_needs_no_problem_file() -> None:
    seed = (EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py").read_text()
    job = EvalJob(
        problem_path="/nonexistent-kfoundry-problems/vector_add.py",  # as on a worker without the driver's files
        problem_source=(EXAMPLES / "kernelbench" / "vector_add.py").read_text(),
        shapes={"N": 256},
        candidate=Candidate(source=seed),
        evaluation=fast_config(trials=1).evaluation,
        backend_plugin="opencl",
    )
    result = LocalExecutor().run([job])[0]
    assert result.outcome is Outcome.correct, result.message


def test_local_executor_yields_results_as_they_finish() -> None:
    config = fast_config(trials=2)
    problem = str(EXAMPLES / "kernelbench" / "vector_add.py")
    slow, fast = EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py", BAD / "compile_error.py"
    jobs = [
        EvalJob(
            problem_path=problem,
            shapes={"N": 512},
            candidate=Candidate(source=p.read_text()),
            evaluation=config.evaluation,
            backend_plugin="opencl",
        )
        for p in (slow, fast)
    ]
    order = [(i, r.outcome) for i, r in LocalExecutor(LocalOptions(workers=2)).run_iter(jobs)]
    assert order == [(1, Outcome.compile_error), (0, Outcome.correct)]  # the quick verdict first


def test_a_batch_stopped_by_its_caller_starts_no_more_jobs(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.plugins.executors import local

    started: list[str] = []
    real = local.run_sandboxed

    def counted(job: EvalJob):  # noqa: ANN202
        if job.timing_method == "standard":  # not a flagged kernel's second measurement
            started.append(job.kind)
        return real(job)

    monkeypatch.setattr(local, "run_sandboxed", counted)
    seed = (EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py").read_text()
    candidates = [
        Candidate(source=seed.replace("BLOCK = PARAMS", f"X_{i} = {i}\nBLOCK = PARAMS")) for i in range(3)
    ]
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 256})

    class Enough(Exception):
        pass

    def stop(i: int, record: object) -> None:
        raise Enough

    with (
        Evaluator(problem, fast_config(tmp_path, trials=1), executor=LocalExecutor()) as ev,
        pytest.raises(Enough),
    ):
        ev.evaluate_many(candidates, on_record=stop)
    assert started == ["reference", "evaluate"]  # the other two candidates never started
