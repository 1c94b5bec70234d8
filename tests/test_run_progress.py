"""The run log's verdict text: a failed evaluation says why in its one line."""

from __future__ import annotations

from kfoundry.core.db.loop import Row
from kfoundry.core.models import EvalRecord, Outcome
from kfoundry.core.run.progress import Progress
from kfoundry.core.search import SearchAsk


def _row(outcome: Outcome, message: str) -> Row:
    record = EvalRecord(
        candidate_hash="h",
        eval_key="k",
        problem="p",
        backend="b",
        device="d",
        outcome=outcome,
        message=message,
    )
    return Row(generation=0, idx=0, ask=SearchAsk(), candidate=None, generator="g", record=record)


def test_a_failed_verdict_carries_the_first_line_of_its_message() -> None:
    message = "\n  runner: CUDA_ERROR_INVALID_CONTEXT in cuIpcOpenMemHandle\nTraceback ...\n"
    _label, _params, verdict = Progress(None).evaluated(_row(Outcome.runtime_error, message))
    assert verdict == "runtime_error: runner: CUDA_ERROR_INVALID_CONTEXT in cuIpcOpenMemHandle"


def test_a_long_message_is_cut_and_stays_one_line() -> None:
    _label, _params, verdict = Progress(None).evaluated(_row(Outcome.compile_error, "x" * 500))
    assert "\n" not in verdict and len(verdict) < 200 and verdict.endswith("...")
