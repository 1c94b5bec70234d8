"""The CUDA speed variants of the offline generator.

The cooperative graph schedule (``graph/fused_coop``: a warp per output for long reductions, ILP
elements per thread, register-blocked matrix products) is CUDA's; its logic is checked here on PoCL,
where the same lowering runs with 32-item work-groups standing in for warps (local-memory "shuffles")
and every loop of four or more terms taken across the lanes, through the real evaluator (its NaN and
infinity trials included). Every CUDA recipe of our problems is compiled for sm_90 by nvcc where nvcc
is installed, and must not spill.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from eval_helpers import fast_config

from kfoundry.core.evaluation import Evaluator
from kfoundry.core.models import Outcome
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline import lower as lowering
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.recipe import Recipe
from tests.offline_helpers import graph_problem_path

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())

#: Problems whose cooperative schedule takes every kind of lane loop: sums and means (split too),
#: max/min, arg-max/min, products, norms, log-sum-exp, softmax rows, scans, short-row norms, losses,
#: cosine similarity, and register-blocked products with epilogues.
COOP = [
    "level1/argmax_dim.py",
    "level1/argmin_dim.py",
    "level1/prod_over_dim.py",
    "level1/logsumexp_dim.py",
    "level1/softmax_dim1_3d.py",
    "level1/cumsum_exclusive.py",
    "level1/cumsum_masked.py",
    "level1/cumprod.py",
    "level1/l1_norm.py",
    "level1/frobenius_norm.py",
    "level1/group_norm.py",
    "level1/cross_entropy.py",
    "level1/cosine_similarity_loss.py",
    "level1/triplet_margin_loss.py",
    "level1/batched_matmul.py",
    "level1/matmul_transposed_a.py",
    "level2/gemm_max_subtract_gelu.py",
    "level2/gemm_group_norm_hardtanh.py",
    "level2/attention_matmul_softmax_matmul.py",
]

#: The recipes added for the H200 (the cooperative graph schedule and the family recipes).
CUDA_VARIANTS = (
    "graph/fused_coop",
    "/cluster_smem",
    "/split_rows_vec",
    "/inner_columns",
    "matmul/sgemm_128x128",
    "elementwise/vector_blocked",
    "matmul/gemv_block",
    "elementwise/vector_ilp",
    "/cluster_stream",
    "/inner_split",
    "matmul/gemv_rows",
)


def _coop_opencl(
    key: str, monkeypatch: pytest.MonkeyPatch, rb: int, tmp: Path | None = None
) -> tuple[Recipe, object]:
    monkeypatch.setattr(lowering, "LANE_MIN", 4)  # small shapes: take even short loops across the lanes
    path = DATA / key if tmp is None else graph_problem_path(DATA / key, tmp)
    problem = load_problem(path, SMALL[key])
    spec = OfflineGenerator().spec(problem.summary())
    recipe = cookbook_graph.recipe(spec, "opencl", "graph/fused_coop", 2)
    if "RB" in recipe.defaults:
        recipe.defaults["RB"] = rb
    return recipe, problem


def test_cuda_offers_the_cooperative_schedule() -> None:
    gen = OfflineGenerator()
    for key, lanes, blocked, shapes in (
        # over a strided dim with 64 x 4095 rows: a thread per row (coalesced), not a warp
        ("level1/softmax_dim1_3d.py", False, False, {}),
        ("level1/softmax_dim1_3d.py", True, False, {"batch_size": 2, "dim2": 64}),  # few rows: a warp each
        # the sizes this case was written for (the file now has KernelBench's, where the schedule differs)
        (
            "level2/gemm_logsumexp_relu.py",
            True,
            True,
            {"batch_size": 128, "in_features": 1024, "out_features": 512},
        ),
        ("level1/conv2d_square.py", False, False, {}),
    ):
        problem = load_problem(DATA / key, shapes)
        recipes = {r.name: r for r in gen.recipes(problem.summary(), "cuda")}
        coop = recipes["graph/fused_coop"]
        assert coop.rank == 2 and coop.defaults["ILP"] == 4
        assert ("kf_lane" in coop.kernel) is lanes, key
        assert ("RB" in coop.defaults) is blocked, key
        assert "graph/fused_coop" not in {r.name for r in gen.recipes(problem.summary(), "opencl")}


@pytest.mark.slow
@pytest.mark.parametrize("key", COOP)
def test_cooperative_schedule_is_correct_on_pocl(
    key: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    recipe, problem = _coop_opencl(key, monkeypatch, rb=2 if "transposed" in key else 4, tmp=tmp_path)
    # lanes, register blocks, or the work-group pieces of a long reduction over a buffer's trailing dims
    assert "kf_lane" in recipe.kernel or "RB" in recipe.defaults or "piece(" in recipe.kernel, key
    with Evaluator(problem, fast_config(cache=False)) as evaluator:  # type: ignore[arg-type]
        record = evaluator.evaluate_many([recipe.candidate()])[0]
    assert record.outcome is Outcome.correct, f"{key}: {record.message}\n{(record.log or '')[-3000:]}"


def _nvcc(source: str, defines: dict[str, object], tmp: Path) -> str:
    src = tmp / "k.cu"
    src.write_text(source)
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    cmd = ["nvcc", "-arch=sm_90", "-cubin", "--resource-usage", "-o", str(tmp / "k.cubin"), *flags, str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("key", sorted(SMALL))
def test_cuda_variants_compile_for_sm90_without_spills(key: str, tmp_path: Path) -> None:
    problem = load_problem(DATA / key, {})
    gen = OfflineGenerator()
    spec = gen.spec(problem.summary())
    for recipe in gen.recipes(problem.summary(), "cuda"):
        if not any(v in recipe.name for v in CUDA_VARIANTS):
            continue
        defines: dict[str, object] = dict(recipe.defaults)
        if "ROW_LEN" in recipe.kernel:
            defines["ROW_LEN"] = spec.R
        if "__cluster_dims__" in recipe.kernel and "def _cluster" in recipe.preamble:  # a row recipe
            ns: dict[str, object] = {}
            exec(recipe.preamble, ns)
            cl = ns["_cluster"](spec.outer, spec.R)  # type: ignore[operator]
            defines["CL"] = cl or 1
            if not cl:  # forward builds the warp kernel's program (ROW_LEN 4) for rows that do not split
                defines["ROW_LEN"] = 4
        out = _nvcc(recipe.kernel, defines, tmp_path)
        spills = [line for line in out.splitlines() if re.search(r"[1-9]\d* bytes spill", line)]
        assert not spills, f"{key} {recipe.name}: {spills}"
