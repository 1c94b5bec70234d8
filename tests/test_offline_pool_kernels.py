"""The offline generator's pooling kernels (``lower_pool``), run on PoCL and compared with eager PyTorch.

Each case writes a small KernelBench-format problem (max / average, 1-D to 3-D, stride != kernel,
padding, dilation, ceil mode, count_include_pad, divisor_override, ragged sizes, NaN inputs, an
elementwise tail applied on store, an input view), renders every ``graph/*`` OpenCL recipe and runs
its kernels. The specialised path is checked to be the one taken (its window is baked into the
source) and the generic path by a module whose window changes after tracing.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from kfoundry.core.problem import load_problem
from kfoundry.plugins.backends.cuda_compile import nvrtc_available
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.index_width import adapt
from kfoundry.runtime import load, synchronize
from tests.offline_helpers import slow_volumes

_GEN = OfflineGenerator()
DATA = Path(__file__).resolve().parent / "data" / "kernelbench"


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


def _problem(tmp: Path, layer: str, shape: tuple[int, ...], nan: bool = False, tail: str = "y") -> Any:
    fill = "    x.view(-1)[::7] = float('nan')\n" if nan else ""
    src = (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"        self.pool = {layer}\n\n"
        "    def forward(self, x):\n"
        "        y = self.pool(x)\n"
        f"        return {tail}\n\n\n"
        "def get_inputs():\n"
        f"    x = torch.randn{shape}\n{fill}"
        "    return [x]\n\n\n"
        "def get_init_inputs():\n"
        "    return []\n"
    )
    path = tmp / "pool_case.py"
    path.write_text(src)
    return load_problem(path, {})


def _run(problem: Any, recipe: Any, mutate: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own ModelNew
    torch.manual_seed(0)
    ref = problem.make_reference()
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    if mutate is not None:
        mutate(ref)
        mutate(model.m0)
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = ref(*inputs)
        got = model(*inputs)
        synchronize()
    return expected, got


def _graph_recipes(problem: Any) -> list[Any]:
    recipes = [r for r in _GEN.recipes(problem.summary(), "opencl") if r.name.startswith("graph/")]
    assert {r.name for r in recipes} >= {"graph/unfused", "graph/fused"}
    return recipes


CASES = [
    ("nn.MaxPool1d(4, stride=2, padding=2, dilation=3)", (2, 3, 37)),
    ("nn.MaxPool1d(8, stride=1, padding=4, dilation=3, ceil_mode=True)", (2, 3, 61)),
    ("nn.AvgPool1d(8, stride=1, padding=4)", (2, 3, 45)),
    ("nn.AvgPool1d(5, stride=3, padding=2, ceil_mode=True, count_include_pad=False)", (3, 2, 29)),
    ("nn.MaxPool2d(4, stride=1, padding=1)", (2, 3, 19, 23)),
    ("nn.MaxPool2d(2, stride=2, padding=1, dilation=3)", (2, 2, 21, 18)),
    ("nn.MaxPool2d((3, 2), stride=(2, 1), padding=(1, 0), ceil_mode=True)", (2, 2, 14, 11)),
    ("nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)", (2, 3, 17, 13)),
    ("nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)", (1, 3, 15, 9)),
    ("nn.AvgPool2d(4, stride=3, padding=2, divisor_override=5)", (2, 2, 16, 19)),
    ("nn.AvgPool2d(5)", (2, 2, 23, 21)),
    ("nn.MaxPool3d(3, stride=2, padding=1, ceil_mode=True)", (2, 2, 9, 10, 11)),
    ("nn.MaxPool3d((2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), dilation=(2, 1, 2))", (1, 2, 8, 9, 10)),
    ("nn.AvgPool3d(3, stride=2, padding=1)", (2, 2, 9, 8, 13)),
    ("nn.AvgPool3d(2, stride=1, padding=1, ceil_mode=True, count_include_pad=False)", (1, 2, 5, 6, 7)),
]


@pytest.mark.parametrize(("layer", "shape"), slow_volumes(CASES))
def test_pool_matches_eager_in_every_schedule(tmp_path: Path, layer: str, shape: tuple[int, ...]) -> None:
    problem = _problem(tmp_path, layer, shape, nan=layer.startswith("nn.Max"))
    for recipe in _graph_recipes(problem):
        assert "KF_PMAX" in recipe.kernel
        assert "const int lo" in recipe.kernel, f"{recipe.name}: the specialised path is missing"
        # the generic branch would write a sentinel: the specialised one must be the path taken
        assert recipe.kernel.count("y[g] = acc;") == 1, recipe.name
        expected, got = _run(
            problem, replace(recipe, kernel=recipe.kernel.replace("y[g] = acc;", "y[g] = 12345.0f;"))
        )
        assert got.shape == expected.shape, recipe.name
        if layer.startswith("nn.Max"):
            assert expected.isnan().any(), "the case should hold NaN windows"
        assert torch.equal(got.isnan(), expected.isnan()), f"{layer} {recipe.name}: NaN positions differ"
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True), (
            f"{layer} {recipe.name}: max error {(got - expected).nan_to_num().abs().max().item()}"
        )


def test_functional_pool_with_an_epilogue_and_a_view(tmp_path: Path) -> None:
    """F.max_pool2d of a permuted input (a loader: the generic kernel) and an elementwise tail on store."""
    problem = _problem(
        tmp_path,
        "nn.Identity()",
        (2, 11, 13, 3),
        tail="torch.sigmoid(F.max_pool2d(y.permute(0, 3, 1, 2), 3, 2, 1)) * 2.0 "
        "+ F.avg_pool2d(y.permute(0, 3, 1, 2), 3, 2, 1)",
    )
    for recipe in _graph_recipes(problem):
        expected, got = _run(problem, recipe)
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), recipe.name


def test_epilogue_reading_the_plane_coordinates(tmp_path: Path) -> None:
    """An elementwise tail with a per-(n, c) operand (broadcast over the pooled plane) applied on store."""
    problem = _problem(
        tmp_path, "nn.ReLU()", (2, 3, 14, 13), tail="F.max_pool2d(y, 3, 1, 1) * x[:, :, :1, :1] - 0.5"
    )
    for recipe in _graph_recipes(problem):
        expected, got = _run(problem, recipe)
        assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6), recipe.name
    fused = next(r for r in _graph_recipes(problem) if r.name == "graph/fused")
    assert "const kf_long pc" in fused.kernel and "const int lo" in fused.kernel  # relu(x) a loader


def test_window_changed_after_tracing_takes_the_generic_path(tmp_path: Path) -> None:
    problem = _problem(tmp_path, "nn.MaxPool2d(3, stride=2, padding=1)", (2, 2, 13, 12), nan=True)

    def widen(m: Any) -> None:
        m.pool.kernel_size, m.pool.stride, m.pool.padding = 3, 1, 0

    for recipe in _graph_recipes(problem):
        expected, got = _run(problem, recipe, widen)
        assert got.shape == expected.shape == (2, 2, 11, 10)
        assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True), recipe.name


def test_forced_64_bit_indices_stay_correct(tmp_path: Path) -> None:
    """The kernels rewritten to 64-bit indices (as at sizes past one sample's 2^31) on PoCL."""
    problem = _problem(tmp_path, "nn.MaxPool2d(3, stride=2, padding=1, dilation=2)", (2, 3, 17, 15), nan=True)
    spec = _GEN.spec(problem.summary())
    for recipe in adapt(_graph_recipes(problem), spec, force=True):
        assert "const long lo" in recipe.kernel, recipe.name
        expected, got = _run(problem, recipe)
        assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True), recipe.name


POOL_ROWS = sorted(
    f"{p.parent.name}/{p.name}"
    for lvl in ("level1", "level2")
    for p in (DATA / lvl).glob("*.py")
    if "pool" in p.name or (lvl == "level2" and re.search(r"pool\d?d\(|Pool\dd\(", p.read_text()))
)


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC not installed (extra `cuda`)")
@pytest.mark.parametrize(
    "key",
    [k if "level1" in k and "3d" not in k else pytest.param(k, marks=pytest.mark.slow) for k in POOL_ROWS],
)
def test_real_size_cuda_pool_kernels_compile_with_nvrtc(key: str) -> None:
    """Every graph recipe of the KernelBench pooling rows at their real sizes (and forced 64-bit) builds
    for sm_90 with NVRTC."""
    from kfoundry.plugins.backends.cuda import CudaBackend, CudaOptions

    backend = CudaBackend(CudaOptions(compiler="nvrtc", compile_only=True, arch="sm_90a"))
    problem = load_problem(DATA / key, {})
    spec = _GEN.spec(problem.summary())
    recipes = [r for r in _GEN.recipes(problem.summary(), "cuda") if r.name.startswith("graph/")]
    assert recipes
    for recipe in [*recipes, *adapt(recipes, spec, force=True)]:
        defines = {k: v for k, v in recipe.defaults.items() if isinstance(v, int)}
        module = backend.load(recipe.kernel, defines=defines)
        assert module.resources, f"{key} {recipe.name}"


def test_overlapping_1d_windows_share_their_taps(tmp_path: Path) -> None:
    """A 1-D window of 8 at stride 1: a work item makes 4 outputs from 11 loads (not 32), the fast path
    only where all 4 are inside the output row."""
    problem = _problem(tmp_path, "nn.AvgPool1d(8, stride=1, padding=4)", (2, 3, 45))
    recipe = next(r for r in _GEN.recipes(problem.summary(), "opencl") if r.name == "graph/fused")
    # the unmasked path's loads (the masked path's are guarded: "= ((...) ? r[t] : 0.0f)")
    assert len(re.findall(r"const float r\d+_\d+ = r\d+\[\d+\];", recipe.kernel)) == 11
    assert re.search(r"o\d+ \+ 4 <= z\d+", recipe.kernel)
