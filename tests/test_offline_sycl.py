"""The offline generator on SYCL: OpenCL recipes translated by ``to_sycl``, judged by the Evaluator, one kf-run loop.

The translation tests are pure Python; the rest runs real kernels on the SYCL backend and skips cleanly
without the ``sycl`` extra (or without a device it can run on).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from eval_helpers import EXAMPLES, SMALL_SHAPES, fast_config

from kfoundry.core.descriptors import get_extractor
from kfoundry.core.evaluation import Evaluator
from kfoundry.core.generator import ProblemSummary
from kfoundry.core.models import Outcome
from kfoundry.core.plugins import reset_plugin_manager
from kfoundry.core.problem import load_problem
from kfoundry.plugins.backends.sycl import SyclBackend, parse_kernels
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.recipe import Untranslatable, to_sycl
from kfoundry.plugins.llms.offline.sycl_descriptors import sycl_descriptors

KB = EXAMPLES / "kernelbench"

TILED = r"""
__kernel void tiled(__global const float* restrict X, __global float* restrict Y, int n) {
    __local float tile[BR][BI + 1];
    int ti = get_local_id(0), tr = get_local_id(1);
    int i = get_group_id(0) * BI + ti;
    tile[tr][ti] = i < n ? X[i] : -INFINITY;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (i < n) Y[i] = fmax(tile[tr][ti], 0.0f) + exp(0.0f);
}
"""


def _summary(stem: str) -> ProblemSummary:
    return ProblemSummary(
        name=stem, reference_source=(KB / f"{stem}.py").read_text(), shapes=SMALL_SHAPES.get(stem, {})
    )


# -- pure Python -------------------------------------------------------------------------------------


def test_to_sycl_maps_dimensions_local_memory_and_builtins() -> None:
    src = to_sycl(TILED)
    assert src.startswith("#include <sycl/sycl.hpp>")
    assert 'extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>))\nvoid tiled(' in src
    assert "auto kf_it = syclext::this_work_item::get_nd_item<2>();" in src
    assert "kf_it.get_local_id(0)" in src and "kf_it.get_local_id(1)" in src and "kf_it.get_group(0)" in src
    assert "syclexp::work_group_static<float[BR][BI + 1]> tile;" in src
    assert "sycl::group_barrier(kf_it.get_group())" in src and "sycl::fmax(" in src and "sycl::exp(" in src
    assert "std::numeric_limits<float>::infinity()" in src
    assert "__global" not in src and "__local" not in src and "__kernel" not in src
    sig = parse_kernels(src)[0]
    assert sig.ndim == 2 and [p.kind for p in sig.params] == ["ptr", "ptr", "i32"]


def test_to_sycl_refuses_what_it_cannot_map() -> None:
    for bad in ("float4 v = vload4(0, X);", "float s = sub_group_reduce_add(x);", "atomic_add(P, 1);"):
        with pytest.raises(Untranslatable):
            to_sycl(f"__kernel void k(__global float* X, __global int* P) {{ {bad} }}")


def test_sycl_recipes_and_descriptors() -> None:
    gen = OfflineGenerator()
    names = {r.name for r in gen.recipes(_summary("softmax"), "sycl")}
    assert {"softmax/naive", "softmax/online", "softmax/workgroup", "softmax/vector"} <= names
    assert all(r.language == "sycl" for r in gen.recipes(_summary("vector_add"), "sycl"))
    ex = get_extractor("sycl")
    assert isinstance(ex, type(sycl_descriptors()))
    cells = {r.name: gen.cell(r, ex) for r in gen.recipes(_summary("softmax"), "sycl")}
    assert cells["softmax/naive"] == (0, 0, 0) and cells["softmax/workgroup"][0] == 2
    assert cells["softmax/workgroup"][2] == 1 and cells["softmax/online"][1] == 2


# -- on the device ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sycl_ready() -> Iterator[None]:
    caps = SyclBackend().capabilities()
    if not caps.can_run:
        pytest.skip(caps.reason)
    if not any(ep.name == "sycl" for ep in md.entry_points(group="kfoundry")):
        pytest.skip("the sycl entry point is not installed (pip install -e .)")
    reset_plugin_manager()
    yield


@pytest.mark.slow  # ~80 s: run by .ci/run after the default tier
@pytest.mark.parametrize("stem", ["softmax", "vector_add"])
def test_every_sycl_recipe_is_judged_correct(sycl_ready: None, stem: str, tmp_path: Path) -> None:
    problem = load_problem(KB / f"{stem}.py", SMALL_SHAPES[stem])
    config = fast_config(
        tmp_path, backend="sycl", max_repeats=10, timeout_s=120.0, cache=False, shape_variants=0
    )
    recipes = OfflineGenerator().recipes(_summary(stem), "sycl")
    assert len(recipes) >= 2
    with Evaluator(problem, config) as evaluator:
        records = evaluator.evaluate_many([r.candidate() for r in recipes])
    for recipe, rec in zip(recipes, records, strict=True):
        assert rec.outcome is Outcome.correct, f"{recipe.name}: {rec.message}\n{rec.log}"


@pytest.mark.slow  # ~70 s: run by .ci/run after the default tier
def test_kf_run_loop_on_sycl_finds_a_correct_kernel(sycl_ready: None, tmp_path: Path) -> None:
    shapes = SMALL_SHAPES["softmax"]
    sets = [
        "backend.name=sycl",
        f"output_dir={tmp_path}",
        "budget.generations=1",
        "budget.proposals_per_generation=2",
        "tuner.every=-1",
        "evaluation.trials=2",
        "evaluation.target_time_s=0.01",
        "evaluation.warmup_s=0.0",
        "evaluation.min_repeats=3",
        "evaluation.max_repeats=10",
        "evaluation.rotate_bytes=0",
        "evaluation.timeout_s=120",
        "evaluation.shape_variants=0",
        "evaluation.correctness_budget_s=0",
    ]
    args = ["kf-run", str(KB / "softmax.py"), *[x for s in sets for x in ("--set", s)]]
    args += [x for k, v in shapes.items() for x in ("--shape", f"{k}={v}")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dbs = list(tmp_path.rglob("kfoundry.db"))
    assert len(dbs) == 1, proc.stdout[-3000:]
    db = sqlite3.connect(dbs[0])
    status, text = db.execute("SELECT status, summary FROM runs").fetchone()
    db.close()
    summary = json.loads(text)
    assert status == "finished" and summary["best_outcome"] == "correct", summary
    assert summary["exported"] and Path(summary["exported"]).name.startswith("best_softmax_sycl")
    assert 'extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY' in Path(summary["exported"]).read_text()
