"""Elementwise chains that use a value several times (``nan_to_num`` of a ``log``, clamps, ``where``):
the cookbook's scalar kernels bind every intermediate value once (``recognize.let_block``), so the kernel
text grows linearly with the chain, not exponentially. Checked on PoCL against PyTorch at small shapes,
and the CUDA sources compiled with NVRTC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.backends.cuda_compile import nvrtc_available
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.runtime import load, synchronize

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
#: the first reuses values (nan_to_num of a log, nested clamps); the others' plain text is already linear
CHAINS = [
    "level1/sign_trunc_masked_fill.py",
    "level1/shrink_threshold_activations.py",
    "level1/mingpt_gelu.py",
]
SMALL = {"batch_size": 3, "dim1": 5, "dim2": 37, "dim": 111}


def _problem(key: str) -> Any:
    problem = load_problem(DATA / key, {})
    return load_problem(DATA / key, {k: v for k, v in SMALL.items() if k in problem.shapes})


@pytest.mark.parametrize("key", CHAINS)
def test_chains_bind_each_value_once(key: str) -> None:
    spec = OfflineGenerator().spec(_problem(key).summary())
    assert spec.expr is not None and spec.expr_lets is not None
    plain, bound = spec.expr("cuda"), spec.expr_lets("cuda")
    assert len(bound) <= len(plain)
    if key.endswith("sign_trunc_masked_fill.py"):  # log(y) four times in nan_to_num, y itself nested
        assert "kf_t" in bound and len(bound) * 2 < len(plain), (len(bound), len(plain))
        assert bound.count("logf(") == 1 < plain.count("logf(")


@pytest.mark.parametrize("key", CHAINS)
def test_opencl_recipes_match_torch(pocl_runtime: None, key: str) -> None:
    problem = _problem(key)
    recipes = OfflineGenerator().recipes(problem.summary(), "opencl")
    assert any("kf_t" in r.kernel for r in recipes) == ("sign_trunc" in key)
    ref = problem.make_reference()
    torch.manual_seed(0)
    xs = problem.make_inputs(1)
    if "sign_trunc" in key:  # what nan_to_num is there for
        xs[0].view(-1)[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    with torch.no_grad():
        expected = ref(*xs)
    for recipe in recipes:
        namespace: dict[str, Any] = {
            "PARAMS": dict(recipe.defaults),
            "__name__": "kf_candidate",
            "load": load,
        }
        exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own
        with torch.no_grad():
            got = namespace["ModelNew"](*problem.make_init_inputs())(*xs)
            synchronize()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True, msg=recipe.name)


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC not installed (extra `cuda`)")
def test_cuda_recipes_compile_with_nvrtc() -> None:
    from kfoundry.plugins.backends.cuda import CudaBackend, CudaOptions

    backend = CudaBackend(CudaOptions(compiler="nvrtc", compile_only=True, arch="sm_90a"))
    problem = load_problem(DATA / CHAINS[0], {})
    recipes = OfflineGenerator().recipes(problem.summary(), "cuda")
    for recipe in recipes:
        assert "[&]() -> float" in recipe.kernel, recipe.name
        defines = {k: v for k, v in recipe.defaults.items() if isinstance(v, int)}
        module = backend.load(recipe.kernel, defines=defines)
        assert module.resources, recipe.name
