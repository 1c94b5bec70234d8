"""A job whose device events the judge's clocks did not confirm is timed once more in a fresh runner:
the second job's events count if they are confirmed there; if not, the judge's clock (the lower of the
two jobs'); a candidate that fails the second job is rejected. (The clock labels are set here as a GPU
job would set them; the jobs themselves run for real on PoCL.)"""

from __future__ import annotations

from pathlib import Path

from eval_helpers import EXAMPLES, fast_config

from kfoundry.core.config import build_plugin
from kfoundry.core.evaluation import Evaluator
from kfoundry.core.evaluation.executor import Executor
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.models import Candidate, EvalRecord, Outcome
from kfoundry.core.problem import load_problem

SEED = EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py"


class Labelled(Executor):
    """The real local executor; evaluate jobs' results get the next clock label (and a time factor)."""

    def __init__(self, inner: Executor, labels: list[tuple[str, float, bool]]) -> None:
        self.inner, self.labels, self.evaluated = inner, labels, 0

    def run(self, jobs: list[EvalJob]) -> list[JobResult]:
        results = self.inner.run(jobs)
        for job, result in zip(jobs, results, strict=True):
            if job.kind != "evaluate" or result.timing is None:
                continue
            clock, factor, ok = self.labels[min(self.evaluated, len(self.labels) - 1)]
            self.evaluated += 1
            result.clock = clock  # type: ignore[assignment]
            result.timing = result.timing.model_copy(update={"median_ms": result.timing.median_ms * factor})
            if not ok:
                result.outcome, result.message = Outcome.mismatch, "wrong on trial 3"
        return results

    def close(self) -> None:
        self.inner.close()


def _evaluate(tmp_path: Path, labels: list[tuple[str, float, bool]]) -> tuple[EvalRecord, Labelled]:
    config = fast_config(tmp_path, cache=False)
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 65536})
    executor = Labelled(build_plugin(config.executor, "executor"), labels)
    with Evaluator(problem, config, executor=executor) as ev:
        record = ev.evaluate(Candidate(source=SEED.read_text(), language="opencl"))
    return record, executor


def test_unconfirmed_events_are_retimed_and_the_confirmed_second_job_counts(tmp_path: Path) -> None:
    record, executor = _evaluate(tmp_path, [("judge", 10.0, True), ("events", 1.0, True)])
    assert executor.evaluated == 2
    assert record.outcome is Outcome.correct and "re-timed in a fresh job" in record.message


def test_twice_unconfirmed_keeps_the_judges_lower_clock(tmp_path: Path) -> None:
    record, executor = _evaluate(tmp_path, [("judge", 3.0, True), ("judge", 5.0, True)])
    assert executor.evaluated == 2
    assert record.outcome is Outcome.correct and "not confirmed in two jobs" in record.message
    first, second = (float(x) for x in record.message.split("(")[-1].split(" ms")[0].split(" and "))
    assert record.timing is not None
    assert abs(record.timing.median_ms - min(first, second)) < 1e-3 * first


def test_wrong_in_the_second_job_is_rejected(tmp_path: Path) -> None:
    record, _ = _evaluate(tmp_path, [("judge", 1.0, True), ("events", 1.0, False)])
    assert record.outcome is Outcome.rejected and "re-timed in a fresh job it failed" in record.message


def test_confirmed_events_are_not_retimed(tmp_path: Path) -> None:
    record, executor = _evaluate(tmp_path, [("events", 1.0, True)])
    assert executor.evaluated == 1 and record.outcome is Outcome.correct
