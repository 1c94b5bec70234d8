"""The graph schedule's CUDA kernels take the FAST elementwise forms (``kf_tanh``; a quotient by 1 + exp(..)
as a product with the MUFU reciprocal) and ``kf_softplus``, as the cookbook's FAST recipes do: compiled by
nvcc for sm_90 where it is installed, and run as CUDA source on the CPU emulation of
``test_offline_cuda_emulated`` (g++ C++20, where the MUFU instructions are exp2f and 1 / x) against eager
PyTorch. The forms' accuracy on the GPU itself, every float32: ``test_offline_fast_math_cuda.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import test_offline_cuda_emulated as emu
import torch

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from tests.offline_helpers import nvcc_resources, run_against_eager

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

#: problem: the forms its graph kernels must hold
CASES = {
    "level1/glu_diff_lerp.py": ("KF_TANHF(", "KF_RCP1P("),  # GLU's sigmoid, tanh
    "level1/binary_cross_entropy_losses.py": ("kf_softplus(",),  # log1p(exp(.)) as written by the losses
    "level1/softplus_beta_max_values.py": ("kf_softplus(",),
}


def _recipe(key: str) -> tuple[Any, Any]:
    small = json.loads((DATA / "small_shapes.json").read_text())
    problem = load_problem(DATA / key, small[key])
    recipe = next(
        r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == "graph/fused_coop"
    )
    return problem, recipe


@pytest.mark.parametrize("key", sorted(CASES))
def test_graph_kernels_take_the_fast_forms(key: str, tmp_path: Path) -> None:
    _, recipe = _recipe(key)
    for form in CASES[key]:
        assert form in recipe.kernel, (key, form)
    if "KF_TANHF(" in recipe.kernel or "KF_RCP1P(" in recipe.kernel:
        assert "#define FAST 1" in recipe.kernel
    if shutil.which("nvcc") is not None:
        nvcc_resources(
            recipe.kernel, {k: v for k, v in recipe.defaults.items() if isinstance(v, int)}, tmp_path
        )


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("key", sorted(CASES))
def test_graph_fast_forms_match_eager_on_the_cpu_emulation(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "load", emu.emu_load)
    problem, recipe = _recipe(key)
    got, expected = run_against_eager(problem, recipe)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
