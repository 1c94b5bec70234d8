"""A flagged kernel (beyond the roofline or the review threshold) is measured again, in a fresh job, by
the differential method (the judge's clock over batches of b and 2b calls) before its record can count:
kept if the two agree, rejected with both times if the second is much slower."""

from __future__ import annotations

from pathlib import Path

from eval_helpers import EXAMPLES, fast_config

from kfoundry.core.config import build_plugin
from kfoundry.core.evaluation import Evaluator
from kfoundry.core.evaluation.evaluator import REMEASURE_TOLERANCE
from kfoundry.core.evaluation.executor import Executor
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.models import Candidate, Outcome
from kfoundry.core.problem import load_problem

SEED = EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py"


class SecondLooksSlower(Executor):
    """The real local executor; the differential job's time comes back ``factor`` times slower (what a
    cheat on the first method would look like to the second)."""

    def __init__(self, inner: Executor, factor: float) -> None:
        self.inner, self.factor, self.methods = inner, factor, []  # type: ignore[var-annotated]

    def run(self, jobs: list[EvalJob]) -> list[JobResult]:
        results = self.inner.run(jobs)
        for job, result in zip(jobs, results, strict=True):
            self.methods.append(job.timing_method)
            if job.timing_method == "differential" and result.timing is not None:
                t = result.timing
                result.timing = t.model_copy(update={"median_ms": t.median_ms * self.factor})
        return results

    def close(self) -> None:
        self.inner.close()


def _evaluate(tmp_path: Path, factor: float) -> tuple[Outcome, str, list[str]]:
    # every correct kernel is flagged; enough timed batches that the two methods' medians are stable
    config = fast_config(tmp_path, flag_speedup_above=1e-9, cache=False, target_time_s=0.1, min_repeats=10)
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 65536})
    executor = SecondLooksSlower(build_plugin(config.executor, "executor"), factor)
    candidate = Candidate(source=SEED.read_text(), language="opencl")
    with Evaluator(problem, config, executor=executor) as ev:
        record = ev.evaluate(candidate)
    return record.outcome, record.message, executor.methods


def test_flagged_kernel_is_remeasured_and_kept_when_methods_agree(tmp_path: Path) -> None:
    outcome, message, methods = _evaluate(tmp_path, 1.0)
    assert methods.count("differential") == 1, methods
    assert outcome is Outcome.correct, message
    assert "re-measured by the differential method" in message


def test_flagged_kernel_is_rejected_when_the_second_method_disagrees(tmp_path: Path) -> None:
    outcome, message, _ = _evaluate(tmp_path, REMEASURE_TOLERANCE * 4)
    assert outcome is Outcome.rejected, message
    assert "timing methods disagree" in message
