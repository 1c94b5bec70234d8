"""Every example's naive seed (and the hand-improved kernels) is judged correct and timed on PoCL."""

from __future__ import annotations

import pytest
from eval_helpers import EXAMPLES, SMALL_SHAPES, fast_config

from kfoundry.core.evaluation import Evaluator
from kfoundry.core.models import Candidate, Outcome
from kfoundry.core.problem import load_problem


@pytest.mark.parametrize("name", sorted(SMALL_SHAPES))
def test_seed_and_improved_kernels_are_correct(name: str) -> None:
    problem = load_problem(EXAMPLES / "kernelbench" / f"{name}.py", SMALL_SHAPES[name])
    sources = [EXAMPLES / "kernelbench" / "seeds" / f"{name}_opencl.py"]
    improved = EXAMPLES / "kernelbench" / "improved" / f"{name}_opencl.py"
    if improved.exists():
        sources.append(improved)
    with Evaluator(problem, fast_config(cache=False)) as evaluator:
        records = evaluator.evaluate_many([Candidate(source=p.read_text(), label=p.name) for p in sources])
    for path, record in zip(sources, records, strict=True):
        assert record.outcome is Outcome.correct, f"{path.name}: {record.message}\n{record.log}"
        assert record.timing is not None and record.timing.n >= 3 and record.timing.median_ms > 0
        assert record.reference_timing is not None and record.speedup is not None and record.speedup > 0
        assert record.compile_time_s is not None and record.resources


def test_improved_matmul_edge_tiles_and_params() -> None:
    """Sizes that are not multiples of the vector width take the scalar edge path; PARAMS reach the kernel."""
    problem = load_problem(EXAMPLES / "kernelbench" / "matmul.py", {"M": 19, "K": 7, "N": 13})
    src = (EXAMPLES / "kernelbench" / "improved" / "matmul_opencl.py").read_text()
    with Evaluator(problem, fast_config(cache=False)) as evaluator:
        records = evaluator.evaluate_many(
            [Candidate(source=src, params={"RB": rb, "VW": vw}) for rb, vw in ((1, 4), (4, 8))]
        )
    assert [r.outcome for r in records] == [Outcome.correct, Outcome.correct], [r.message for r in records]


#: A one-token change that breaks each native kernel.
BREAK = {
    "vector_add": ("a[i] + b[i]", "a[i] - b[i]"),
    "matmul": ("+=", "-="),
    "softmax": ("out[j] *= inv", "out[j] *= 1.01f * inv"),
}


@pytest.mark.parametrize(
    ("task", "sizes", "params"),
    [
        ("vector_add", {"N": 5000}, {"BLOCK": 128, "VEC": 4}),
        ("matmul", {"M": 24, "N": 20, "K": 16}, {"BLOCK_X": 8, "BLOCK_Y": 2, "WPT": 4}),
        ("softmax", {"ROWS": 3, "COLS": 100}, {"WG": 32}),
    ],
)
def test_native_tasks(task: str, sizes: dict[str, int], params: dict[str, int]) -> None:
    problem = load_problem(EXAMPLES / "native" / f"{task}.toml", sizes)
    old, new = BREAK[task]
    assert old in problem.source
    with Evaluator(problem, fast_config(cache=False)) as evaluator:
        default, tuned, broken = evaluator.evaluate_many(
            [
                Candidate(source=problem.source, kind="native"),
                Candidate(source=problem.source, kind="native", params=params),
                Candidate(source=problem.source.replace(old, new, 1), kind="native", params=params),
            ]
        )
    assert default.outcome is Outcome.correct, default.message
    assert tuned.outcome is Outcome.correct, tuned.message
    assert broken.outcome is Outcome.mismatch, broken.message
