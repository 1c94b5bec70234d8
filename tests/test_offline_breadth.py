"""Breadth of the offline generator: every problem of tests/data/kernelbench (our own, in the KernelBench
format) is recognised, and its lowered recipes are judged correct on PoCL by the real evaluator.

The default run evaluates one problem per op family (the fused recipe, small shapes); the full sweep
(every problem, every recipe) is slow-marked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from eval_helpers import fast_config

from kfoundry.core.evaluation import Evaluator
from kfoundry.core.generator import Attempt, GenerationRequest, GeneratorUnsupported, ProblemSummary
from kfoundry.core.models import DeviceProfile, EvalRecord, Outcome
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.recognize import recognize

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())
PROBLEMS = sorted(SMALL)

#: One problem per op family: a few evaluated in the default run, the rest slow-marked.
FAST = [
    "level1/conv_transpose2d.py",
    "level1/cumsum_exclusive.py",
    "level1/cross_entropy.py",
    "level2/gemm_max_subtract_gelu.py",
    "level2/conv2d_group_norm_scale_maxpool_clamp.py",
]
FAMILIES = [
    *FAST,
    "level1/batched_matmul.py",
    "level1/matmul_transposed_both.py",
    "level1/matmul_lower_triangular.py",
    "level1/max_pool2d.py",
    "level1/max_pool3d.py",
    "level1/avg_pool3d.py",
    "level1/cumsum_reverse.py",
    "level1/argmin_dim.py",
    "level1/frobenius_norm.py",
    "level1/group_norm.py",
    "level1/batch_norm.py",
    "level1/kl_div_loss.py",
    "level1/cosine_similarity_loss.py",
    "level1/conv2d_grouped.py",
    "level1/sdpa_causal.py",
    "level2/conv_transpose3d_batch_norm_avgpool.py",
]


def _summary(key: str) -> ProblemSummary:
    problem = load_problem(DATA / key, SMALL[key])
    return ProblemSummary(name=key, reference_source=problem.source, shapes=dict(problem.shapes))


def _evaluate(key: str, names: list[str] | None) -> list[tuple[str, Outcome, str]]:
    problem = load_problem(DATA / key, SMALL[key])
    recipes = OfflineGenerator().recipes(problem.summary(), "opencl")
    chosen = [r for r in recipes if names is None or r.name in names] or recipes[-1:]
    with Evaluator(problem, fast_config(cache=False)) as evaluator:
        records = evaluator.evaluate_many([r.candidate() for r in chosen])
    return [
        (r.name, rec.outcome, f"{rec.message}\n{rec.log[-3000:] if rec.log else ''}")
        for r, rec in zip(chosen, records, strict=True)
    ]


def test_every_problem_is_recognised_quickly() -> None:
    for key in PROBLEMS:
        start = time.perf_counter()
        spec = recognize(_summary(key))
        assert spec.family, key
        assert time.perf_counter() - start < 5.0, f"{key}: recognition took too long"


def test_the_families_have_their_problems() -> None:
    assert len([k for k in PROBLEMS if k.startswith("level1/")]) >= 50
    assert len([k for k in PROBLEMS if k.startswith("level2/")]) >= 15
    assert set(FAMILIES) <= set(PROBLEMS)


def test_recognition_does_not_allocate_full_size_inputs() -> None:
    """A problem with a 64 GiB input is recognised (traced on the meta device)."""
    src = (DATA / "level1" / "l2_norm.py").read_text()
    summary = ProblemSummary(
        name="huge", reference_source=src, shapes={"batch_size": 1 << 20, "dim": 1 << 14}
    )
    assert recognize(summary).family == "graph"


def test_unknown_op_is_refused_in_one_line() -> None:
    src = (
        (DATA / "level1" / "cumsum.py")
        .read_text()
        .replace("torch.cumsum(x, dim=self.dim)", "torch.sort(x)[0]")
    )
    with pytest.raises(GeneratorUnsupported, match="sort.*LLM") as exc:
        recognize(ProblemSummary(name="sort", reference_source=src))
    assert "\n" not in str(exc.value)


def test_graph_recipes_read_sizes_from_the_inputs() -> None:
    """Sizes are kernel arguments: no traced size appears in the kernel source."""
    recipes = OfflineGenerator().recipes(_summary("level1/conv2d_asymmetric_strided.py"), "opencl")
    for recipe in recipes:
        assert re.search(r"int z\d+", recipe.kernel)
        assert not re.search(r"\b(11|10)\b", recipe.kernel), recipe.name


@pytest.mark.parametrize(
    "key", [k if k in FAST else pytest.param(k, marks=pytest.mark.slow) for k in FAMILIES]
)
def test_family_is_correct_on_pocl(key: str) -> None:
    for name, outcome, message in _evaluate(key, ["graph/fused"]):
        assert outcome is Outcome.correct, f"{key} {name}: {message}"


@pytest.mark.slow
@pytest.mark.parametrize("key", PROBLEMS)
def test_every_recipe_of_every_problem_is_correct_on_pocl(key: str) -> None:
    for name, outcome, message in _evaluate(key, None):
        assert outcome is Outcome.correct, f"{key} {name}: {message}"


def test_cuda_graph_recipes_render() -> None:
    for key in ("level1/sdpa_causal.py", "level2/conv2d_group_norm_scale_maxpool_clamp.py"):
        for recipe in OfflineGenerator().recipes(_summary(key), "cuda"):
            assert 'extern "C" __global__' in recipe.kernel and "__kernel" not in recipe.kernel


def _request(key: str, **kw: object) -> GenerationRequest:
    device = DeviceProfile(backend="opencl", name="cpu", max_work_group_size=4096)
    return GenerationRequest(problem=_summary(key), language="opencl", device=device, **kw)  # type: ignore[arg-type]


def test_a_recipe_that_failed_correctness_is_not_proposed_again() -> None:
    gen = OfflineGenerator()
    key = "level1/matrix_vector.py"
    seeds = gen.seeds(_request(key, n=8))
    failed = seeds[1].candidate
    assert failed is not None
    bad = EvalRecord(
        candidate_hash="h", eval_key="k", problem="p", backend="opencl", device="d", outcome=Outcome.mismatch
    )
    for i in range(6):
        proposals = gen.propose(
            _request(key, mode="improve", parent=Attempt(candidate=failed, record=bad), n=4, seed=i)
        )
        assert all(p.candidate is not None and p.candidate.label != failed.label for p in proposals)


def test_the_naive_recipe_is_the_seed_when_there_is_no_seed_file() -> None:
    seeds = OfflineGenerator().seeds(_request("level1/cumsum.py", n=4))
    assert seeds[0].candidate is not None and seeds[0].candidate.meta.get("seed") is True
    assert seeds[0].candidate.label == "graph/unfused"
    assert not any(p.candidate is not None and p.candidate.meta.get("seed") for p in seeds[1:])


def test_integer_powers_are_products() -> None:
    src = (
        (DATA / "level1" / "leaky_relu_broadcast_bias.py")
        .read_text()
        .replace(
            "F.leaky_relu(x + b, 0.1)",
            "0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0)))) + b ** 2",
        )
    )
    for recipe in OfflineGenerator().recipes(ProblemSummary(name="gelu", reference_source=src), "cuda"):
        assert "pow" not in recipe.kernel, recipe.name


def test_kf_run_refuses_an_unknown_op_before_making_a_run_folder(tmp_path: Path) -> None:
    src = (
        (DATA / "level1" / "cumsum.py")
        .read_text()
        .replace("torch.cumsum(x, dim=self.dim)", "torch.sort(x)[0]")
    )
    problem = tmp_path / "sorting.py"
    problem.write_text(src)
    runs = tmp_path / "runs"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from kfoundry.core.cli import main; sys.exit(main())",
            str(problem),
            "--set",
            f'output_dir="{runs}"',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "sort" in lines[0] and "LLM" in lines[0], done.stderr
    assert not runs.exists() or not any(runs.iterdir())
