"""Fused elementwise DAGs emitted with let-bound temporaries and the four-element pointwise path over any
shape (``Lowering.bound_load``, ``Lowering._quads``): a value used N times is computed once
(``const float kf_tN``), a cat's guarded operands stay inline under its guard, coordinates are decomposed
once per four elements and stepped with a carry (odd last dimensions, sizes of one). Run on PoCL against
PyTorch in float64; the CUDA source is compiled with nvcc for sm_90 where nvcc is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.runtime import load, synchronize

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

#: y = sigmoid(x) used five times (a tree would repeat its expf five times)
SHARED = """import torch
import torch.nn as nn
import torch.nn.functional as F

a = 3
b = 1
c = 7


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = torch.sigmoid(x)
        z = y * y + 3.0 * y - torch.tanh(y) / (y + 1.0)
        p = torch.cat([torch.exp(z), y * 2.0], dim=-1)
        return p * p + p - z.sum(-1, keepdim=True)


def get_inputs():
    return [torch.randn(a, b, c)]


def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def _recipe(path: Path, dims: dict[str, int], name: str, lang: str = "opencl"):  # noqa: ANN202
    problem = load_problem(path, dims)
    return problem, cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), lang, name, 1)


def _run(problem, recipe) -> None:  # noqa: ANN001
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    init = problem.make_init_inputs()
    torch.manual_seed(0)
    ref = problem.make_reference()
    torch.manual_seed(0)
    model = namespace["ModelNew"](*init)
    model.load_state_dict(ref.state_dict(), strict=False)
    torch.manual_seed(1)
    xs = problem.make_inputs(1)
    with torch.no_grad():
        expected = ref.double()(*[x.double() for x in xs])
        got = model(*xs)
        synchronize()
    assert got.shape == expected.shape
    err = ((got.double() - expected).abs() / (expected.abs() + 1e-3)).max().item()
    assert err < 1e-4, f"{recipe.name}: max relative error {err}"


@pytest.mark.parametrize("name", ["graph/fused", "graph/fused_coop"])
def test_glu_diff_lerp_each_sigmoid_once(name: str) -> None:
    # last dimension 16 after the diff (17 - 1), then 15 (odd: the carry path)
    for length in (17, 16):
        problem, recipe = _recipe(
            DATA / "level1/glu_diff_lerp.py", {"batch_size": 2, "channels": 6, "length": length}, name
        )
        # two sigmoids (glu at i and i + 1) and one tanh per element, not ~20 and ~5 as a tree
        assert recipe.kernel.count("exp(") + recipe.kernel.count("expf(") == 2, recipe.kernel
        assert recipe.kernel.count("tanh") == 1 and "const float kf_t" in recipe.kernel
        assert "& 3) == 0" not in recipe.kernel and "KF_STORE4(y," in recipe.kernel
        _run(problem, recipe)


@pytest.mark.parametrize(
    "dims", [{"a": 3, "b": 1, "c": 7}, {"a": 1, "b": 5, "c": 1}, {"a": 2, "b": 2, "c": 4}]
)
def test_shared_value_emitted_once_and_guard_kept(tmp_path: Path, dims: dict[str, int]) -> None:
    path = tmp_path / "shared.py"
    path.write_text(SHARED)
    problem, recipe = _recipe(path, dims, "graph/fused")
    out = recipe.kernel[recipe.kernel.rindex("KF_KERNEL") :]  # the output kernel (after the sum's)
    # p (a cat: its branches guarded, so inline under the guard) used three times: bound once, so the
    # tanh inside it appears once, not three times
    assert out.count("tanh") == 1, out
    assert out.count("const float kf_t") >= 3, out
    _run(problem, recipe)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_source_compiles_sm90(tmp_path: Path) -> None:
    for name in ("graph/fused", "graph/fused_coop", "graph/unfused"):
        _, recipe = _recipe(
            DATA / "level1/glu_diff_lerp.py", {"batch_size": 2, "channels": 6, "length": 17}, name, "cuda"
        )
        src = tmp_path / "k.cu"
        src.write_text(recipe.kernel)
        res = subprocess.run(
            ["nvcc", "-arch=sm_90", "-c", str(src), "-o", str(tmp_path / "k.o")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert res.returncode == 0, res.stderr


#: three full reductions combined (sum, mean, a size factor, a difference, a negation)
LOSSES = """import torch
import torch.nn as nn

a = 7
b = 11


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        s = torch.sum(x * y) / x.shape[0]
        return torch.mean(torch.exp(-x.abs())) - 0.5 * s + (-(y * y).mean()) * 2.0


def get_inputs():
    return [torch.randn(a, b), torch.rand(a, b)]


def get_init_inputs():
    return []
"""


def _passes(kernel: str) -> int:
    """How many kernels read the first input (buf0)."""
    return len(re.findall(r"KF_KERNEL \w+\([^)]*\bbuf0\b", kernel))


@pytest.mark.parametrize("name", ["graph/fused", "graph/fused_coop", "graph/unfused"])
def test_sum_of_full_reductions_is_one_pass(tmp_path: Path, name: str) -> None:
    path = tmp_path / "losses.py"
    path.write_text(LOSSES)
    for dims in ({"a": 7, "b": 11}, {"a": 300, "b": 130}):
        problem, recipe = _recipe(path, dims, name)
        if name != "graph/unfused":
            assert _passes(recipe.kernel) == 1, recipe.kernel
        _run(problem, recipe)


@pytest.mark.parametrize("dims", [{"batch_size": 7, "classes": 11}, {"batch_size": 64, "classes": 300}])
def test_bce_losses_one_pass(dims: dict[str, int]) -> None:
    problem, recipe = _recipe(DATA / "level1/binary_cross_entropy_losses.py", dims, "graph/fused")
    assert _passes(recipe.kernel) == 1, recipe.kernel  # was three: one per loss
    _run(problem, recipe)
