"""Planted bad kernels (tests/data/bad/) are each caught with the right outcome, in one batch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eval_helpers import BAD, EXAMPLES, fast_config

from kfoundry.core.evaluation import Evaluator
from kfoundry.core.models import Candidate, EvalRecord, Outcome
from kfoundry.core.problem import load_problem

EXPECTED: dict[str, tuple[Outcome, str]] = {
    "wrong_result": (Outcome.mismatch, "the float32 reference's own error against float64"),
    "off_by_one": (Outcome.mismatch, "trial 0: output 0:"),
    "no_write": (Outcome.mismatch, "trial 0: output 0:"),
    "infinite_loop": (Outcome.timeout, "timed out"),
    "crash": (Outcome.runtime_error, "worker crashed: killed by SIG"),
    "out_of_memory": (Outcome.runtime_error, "allocate"),
    "input_mutation": (Outcome.rejected, "modified input 0"),
    "constant_output": (Outcome.rejected, "constant"),
    "torch_fallback": (Outcome.rejected, "forward computes with torch (add)"),
    "static_fallback": (Outcome.rejected, "static check: line 13: torch.add in forward"),
    "compile_error": (Outcome.compile_error, "expected ';'"),
    "wrong_shape": (Outcome.wrong_shape, "shape [2047], expected [2048]"),
    "input_independent": (Outcome.mismatch, "the float32 reference's own error against float64"),
    "call_count_cheat": (Outcome.rejected, "forward launched no kernel"),
    "thread_cheat": (Outcome.rejected, "trial 0: forward started a thread (Thread-"),
}


@pytest.fixture(scope="module")
def verdicts() -> Iterator[dict[str, EvalRecord]]:
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 2048})
    config = fast_config(cache=False, timeout_s=12.0, memory_limit_mb=4096)
    config.executor.options = {"workers": 2}
    # All at once, two at a time: the hanging kernel holds the device's lane until its timeout, and the
    # jobs queued behind it do not count that wait against their own timeouts.
    names = sorted(EXPECTED)
    with Evaluator(problem, config) as evaluator:
        records = evaluator.evaluate_many(
            [Candidate(source=(BAD / f"{n}.py").read_text(), label=n) for n in names]
        )
    yield dict(zip(names, records, strict=True))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_planted_kernel_is_caught(verdicts: dict[str, EvalRecord], name: str) -> None:
    outcome, fragment = EXPECTED[name]
    record = verdicts[name]
    assert record.outcome is outcome, f"{name}: {record.outcome.value}: {record.message}"
    assert fragment in record.message
    assert record.timing is None and record.speedup is None


def test_compile_error_keeps_the_compiler_log(verdicts: dict[str, EvalRecord]) -> None:
    assert "error" in verdicts["compile_error"].log


def test_input_independent_output_rejected_even_within_tolerance() -> None:
    """With a tolerance loose enough to pass any value, an output that ignores its inputs is still rejected."""
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 512})
    with Evaluator(problem, fast_config(cache=False, atol=100.0, rtol=1.0, trials=3)) as evaluator:
        record = evaluator.evaluate(Candidate(source=(BAD / "input_independent.py").read_text()))
    assert record.outcome is Outcome.rejected, record.message
    assert "does not depend on the input" in record.message
