"""Results cached in the store, lifecycle hooks, and a kill mid-evaluation losing nothing stored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from eval_helpers import BAD, EXAMPLES, ROOT, fast_config

from kfoundry import hookimpl
from kfoundry.core.evaluation import EvalJob, Evaluator, Executor, JobResult, run_sandboxed
from kfoundry.core.models import Candidate, EvalRecord, Outcome
from kfoundry.core.plugins import get_plugin_manager
from kfoundry.core.problem import load_problem
from kfoundry.core.store import Store

SEED = (EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py").read_text()


class CountingExecutor(Executor):
    """The local sandbox, counting the jobs it is given."""

    def __init__(self) -> None:
        self.jobs: list[EvalJob] = []

    def run(self, jobs: list[EvalJob]) -> list[JobResult]:
        self.jobs.extend(jobs)
        return [run_sandboxed(job) for job in jobs]


class Observer:
    """A plugin that records evaluations and vetoes sources containing 'VETO'."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    @hookimpl
    def kf_candidate_evaluated(self, candidate: Candidate, record: EvalRecord) -> None:
        self.seen.append((record.outcome.value, record.cached))

    @hookimpl
    def kf_static_checks(self, candidate: Candidate, problem_name: str) -> list[str] | None:
        return [f"vetoed for {problem_name}"] if "VETO" in candidate.source else None


@pytest.fixture
def observer() -> Iterator[Observer]:
    manager = get_plugin_manager()
    obs = Observer()
    manager.add_plugin(obs, "test-eval-observer", package="(test)")
    yield obs
    manager.remove_plugin("test-eval-observer")


def test_repeat_evaluation_served_from_store(tmp_path: Path, observer: Observer) -> None:
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 1024})
    store = Store(tmp_path / "kf.sqlite")
    spy = CountingExecutor()
    evaluator = Evaluator(problem, fast_config(), store=store, run_id="r1", executor=spy)
    first = evaluator.evaluate(Candidate(source=SEED))
    assert first.outcome is Outcome.correct and not first.cached
    assert [j.kind for j in spy.jobs] == ["reference", "evaluate"]

    start = time.perf_counter()
    again = evaluator.evaluate(Candidate(source=SEED))
    elapsed_ms = (time.perf_counter() - start) * 1e3
    print(f"repeat evaluation served from the store in {elapsed_ms:.2f} ms")
    assert again.cached and len(spy.jobs) == 2
    assert again.timing == first.timing and again.eval_key == first.eval_key

    # A fresh evaluator on the same store (as after a restart) runs nothing at all.
    spy2 = CountingExecutor()
    reopened = Evaluator(
        problem, fast_config(), store=Store(tmp_path / "kf.sqlite"), run_id="r2", executor=spy2
    )
    assert reopened.evaluate(Candidate(source=SEED)).cached and spy2.jobs == []
    # ...and the cached result is recorded for the new run too.
    assert len(store.evaluations(run_id="r2")) == 1

    # Other parameter values are another candidate: evaluated, not served.
    other = evaluator.evaluate(Candidate(source=SEED, params={"BLOCK": 128}))
    assert not other.cached and other.outcome is Outcome.correct and len(spy.jobs) == 3
    assert observer.seen == [("correct", False), ("correct", True), ("correct", True), ("correct", False)]


def test_plugin_static_check_veto(tmp_path: Path, observer: Observer) -> None:
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 256})
    spy = CountingExecutor()
    store = Store(tmp_path / "kf.sqlite")
    evaluator = Evaluator(problem, fast_config(), store=store, executor=spy)
    vetoed = Candidate(source=SEED + "\n# VETO\n")
    record = evaluator.evaluate(vetoed)
    assert record.outcome is Outcome.rejected and "vetoed for vector_add" in record.message
    assert spy.jobs == [] and observer.seen == [("rejected", False)]
    # A stored rejection is never served from the cache: without the veto the candidate is evaluated.
    get_plugin_manager().remove_plugin("test-eval-observer")
    assert evaluator.evaluate(vetoed).outcome is Outcome.correct and len(spy.jobs) == 2
    # ...and a veto added later applies even to a cached verdict.
    get_plugin_manager().add_plugin(observer, "test-eval-observer", package="(test)")
    again = evaluator.evaluate(vetoed)
    assert again.outcome is Outcome.rejected and len(spy.jobs) == 2


def test_language_mismatch_is_a_compile_error() -> None:
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 256})
    evaluator = Evaluator(problem, fast_config(cache=False), executor=CountingExecutor())
    record = evaluator.evaluate(Candidate(source=SEED, language="cuda"))
    assert record.outcome is Outcome.compile_error and "backend opencl compiles opencl" in record.message


SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("ignore")
    sys.path.insert(0, {tests!r})
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.models import Candidate
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store
    from eval_helpers import fast_config
    problem = load_problem({problem!r}, {{"N": 1024}})
    ev = Evaluator(problem, fast_config(timeout_s=300.0), store=Store(sys.argv[1]), run_id="killed")
    for path in sys.argv[2:]:
        record = ev.evaluate(Candidate(source=open(path).read()))
        print("STORED", record.outcome.value, flush=True)
    """
)


def test_kill_mid_evaluation_loses_nothing_stored(tmp_path: Path) -> None:
    db = tmp_path / "kf.sqlite"
    script = SCRIPT.format(tests=str(ROOT / "tests"), problem=str(EXAMPLES / "kernelbench" / "vector_add.py"))
    seed_path = EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(db), str(seed_path), str(BAD / "infinite_loop.py")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "KF_LOAD_PLUGINS": "opencl,local"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "STORED correct", line
    time.sleep(1.0)  # now inside the second (never-ending) evaluation
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = Store(db)
    kept = store.evaluations(run_id="killed")
    assert [r.outcome for r in kept] == [Outcome.correct]
    spy = CountingExecutor()
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 1024})
    again = Evaluator(problem, fast_config(), store=store, run_id="killed", executor=spy).evaluate(
        Candidate(source=seed_path.read_text())
    )
    assert again.cached and again.outcome is Outcome.correct and spy.jobs == []


class FlakyExecutor(CountingExecutor):
    """The real sandbox, except that the first candidate job 'loses' its sandbox server."""

    def run(self, jobs: list[EvalJob]) -> list[JobResult]:
        if any(j.kind == "evaluate" for j in jobs) and not any(j.kind == "evaluate" for j in self.jobs):
            self.jobs.extend(jobs)
            return [
                JobResult(outcome=Outcome.runtime_error, message="worker crashed: the sandbox server died")
            ]
        return super().run(jobs)


def test_machinery_failures_are_stored_but_never_served(tmp_path: Path) -> None:
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 256})
    spy = FlakyExecutor()
    evaluator = Evaluator(problem, fast_config(), store=Store(tmp_path / "kf.sqlite"), executor=spy)
    evaluator.reference_timing()
    first = evaluator.evaluate(Candidate(source=SEED))
    assert first.outcome is Outcome.runtime_error and first.eval_key.endswith("-env")
    second = evaluator.evaluate(Candidate(source=SEED))
    assert second.outcome is Outcome.correct and not second.cached
