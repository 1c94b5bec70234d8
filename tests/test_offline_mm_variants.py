"""fp32 matrix-product variants (family ``gemm``: :mod:`kfoundry.plugins.llms.offline.recognize_mm`,
:mod:`kfoundry.plugins.llms.offline.cookbook_mm_variants`) against eager.

``matmul/strided_tiles`` and ``matmul/row_scale`` run on PoCL; the CUDA ``matmul/sgemm_warp`` variant (batch
on grid z with broadcast strides, A read [K, M] by float4 loads along M, B read [N, K], triangular tiles
skipped, the epilogue of zero past the diagonal) on the CPU emulation and compiled by NVRTC for sm_90.
Shapes are ragged (M, N, K not multiples of the tiles, some not of 4: the 4-byte load kernel).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_offline_matmul_async import _emu

import kfoundry.runtime as runtime
from kfoundry.core.plugins import get_plugin
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())

_HEAD = "import torch\nimport torch.nn as nn\n\n"
_TAIL = """

def get_inputs():
    return [{a}, {b}]


def get_init_inputs():
    return []
"""

#: Problems written here: (name, sizes, forward body, the two inputs).
EXTRA: dict[str, tuple[str, str, str, str]] = {
    # a batch of one broadcasts against B's batch; relu epilogue
    "bcast_relu": (
        "B = 3\nM = 37\nK = 21\nN = 42\n",
        "torch.relu(torch.matmul(A, B) - 0.5)",
        "torch.rand(1, M, K)",
        "torch.rand(B, K, N)",
    ),
    # tril below the diagonal, an epilogue whose value at zero is not zero
    "tril_m1_affine": (
        "N = 300\n",
        "torch.tril(A @ B, diagonal=-1) * 2.0 + 1.0",
        "torch.rand(N, N)",
        "torch.rand(N, N)",
    ),
    # triu above the diagonal of a non-square product (M > N: every tile row is partly dead)
    "triu_p2_rect": (
        "M = 290\nK = 33\nN = 140\n",
        "torch.triu(torch.matmul(A, B), 2)",
        "torch.rand(M, K)",
        "torch.rand(K, N)",
    ),
    # einsum of a batch, sigmoid epilogue
    "einsum_bmm_sigmoid": (
        "B = 2\nI = 19\nJ = 24\nK = 36\n",
        "torch.sigmoid(torch.einsum('bij,bjk->bik', A, B))",
        "torch.rand(B, I, J)",
        "torch.rand(B, J, K)",
    ),
    # A @ B.T (B read [N, K]) with a tanh epilogue
    "mm_tb_tanh": (
        "M = 70\nK = 36\nN = 132\n",
        "torch.tanh(A @ B.T)",
        "torch.rand(M, K)",
        "torch.rand(N, K)",
    ),
    # diag(a) @ B with an epilogue
    "diag_gelu": (
        "N = 37\nM = 23\n",
        "torch.nn.functional.gelu(torch.diag(A) @ B)",
        "torch.rand(N) - 0.5",
        "torch.randn(N, M)",
    ),
    # diag(a) @ B where B has inf and NaN entries and a zeros: 0 * inf is NaN in the product's other rows
    "diag_nonfinite": (
        "N = 29\nM = 44\n",
        "torch.diag(A) @ B",
        "torch.where(torch.rand(N) < 0.2, torch.zeros(N), torch.rand(N))",
        "torch.where(torch.rand(N, M) < 0.01, torch.full((N, M), float('inf')), "
        "torch.where(torch.rand(N, M) < 0.01, torch.full((N, M), float('nan')), torch.rand(N, M)))",
    ),
}


def _problem(key: str, shape: dict[str, int], tmp_path: Path) -> Any:
    if key in EXTRA:
        sizes, body, a, b = EXTRA[key]
        src = (
            f"{_HEAD}{sizes}\n\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
            f"    def forward(self, A, B):\n        return {body}\n{_TAIL.format(a=a, b=b)}"
        )
        path = tmp_path / f"{key}.py"
        path.write_text(src)
        return load_problem(path, shape)
    return load_problem(DATA / key, shape or SMALL.get(key, {}))


def _run(problem: Any, name: str, language: str, params: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    recipes = OfflineGenerator().recipes(problem.summary(), language)
    recipe = next(r for r in recipes if r.name == name)
    torch.manual_seed(0)
    reference = problem.make_reference()
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = reference(*inputs)
    namespace: dict[str, Any] = {"PARAMS": {**recipe.defaults, **params}, "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        got = model(*inputs)
        runtime.synchronize()
    return got, expected


#: (problem, shape overrides, expected dims of the spec)
SPECS: list[tuple[str, dict[str, int], dict[str, int]]] = [
    ("level1/batched_matmul.py", {"batch_size": 3, "m": 37, "k": 29, "n": 45}, {"batch": 3}),
    ("level1/matmul_transposed_a.py", {"M": 37, "K": 29, "N": 45}, {"ta": 1}),
    ("level1/matmul_transposed_a.py", {"M": 140, "K": 40, "N": 264}, {"ta": 1}),
    ("level1/matmul_transposed_both.py", {"M": 37, "K": 29, "N": 45}, {"ta": 1, "tb": 1}),
    ("level1/matmul_transposed_both.py", {"M": 132, "K": 36, "N": 260}, {"ta": 1, "tb": 1}),
    ("level1/matmul_lower_triangular.py", {"N": 300}, {"tri": 1, "dg": 0}),
    ("level1/matmul_upper_triangular.py", {"N": 270}, {"tri": 2, "dg": 0}),
    ("level1/matmul_diag.py", {"N": 37, "M": 45}, {"diag": 1}),
    ("level1/tensor4d_matrix_einsum.py", {"b": 2, "i": 3, "j": 5, "l": 18, "k": 35}, {"flat": 1}),
    ("bcast_relu", {}, {"batch": 3}),
    ("tril_m1_affine", {}, {"tri": 1, "dg": -1}),
    ("triu_p2_rect", {}, {"tri": 2, "dg": 2}),
    ("einsum_bmm_sigmoid", {}, {"batch": 2}),
    ("mm_tb_tanh", {}, {"tb": 1}),
    ("diag_gelu", {}, {"diag": 1}),
    ("diag_nonfinite", {}, {"diag": 1}),
]
_IDS = [
    f"{k.removeprefix('level1/').removesuffix('.py')}-{'-'.join(map(str, s.values()))}" for k, s, _ in SPECS
]


@pytest.mark.parametrize(("key", "shape", "dims"), SPECS, ids=_IDS)
def test_variant_is_recognised(key: str, shape: dict[str, int], dims: dict[str, int], tmp_path: Path) -> None:
    spec = OfflineGenerator().spec(_problem(key, shape, tmp_path).summary())
    assert spec.family == "gemm"
    assert {k: v for k, v in spec.mm.items() if k != "mmv"} == dims


def test_plain_products_keep_their_recipes() -> None:
    for key in ("level1/square_matmul.py", "level1/matmul_3d_2d.py", "level1/matmul_irregular.py"):
        assert (
            OfflineGenerator().spec(load_problem(DATA / key, SMALL.get(key, {})).summary()).family == "matmul"
        )


@pytest.fixture
def _pocl() -> Any:
    backend = get_plugin("backend", "opencl").build({})
    backend.require_device()
    runtime.set_backend(backend)
    yield
    runtime.set_backend(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("key", "shape", "dims"), SPECS, ids=_IDS)
def test_variant_matches_eager_on_pocl(
    key: str, shape: dict[str, int], dims: dict[str, int], tmp_path: Path, _pocl: Any
) -> None:
    name = "matmul/row_scale" if dims.get("diag") else "matmul/strided_tiles"
    got, expected = _run(_problem(key, shape, tmp_path), name, "opencl", {})
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, equal_nan=True)


#: sgemm_warp cases: the default tiles, and 64 x 128 ones (more tiles: dead and diagonal ones at small N)
SMALL_TILE = {"BM": 64, "BN": 128, "WM": 32, "WN": 64, "TM": 8, "TN": 8, "BK": 8, "MINB": 3}
WARP = [(k, s, d) for k, s, d in SPECS if not d.get("diag")]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(
    ("key", "shape", "dims"), WARP, ids=[i for i, c in zip(_IDS, SPECS, strict=True) if c in WARP]
)
@pytest.mark.parametrize("tile", ["default", pytest.param("64x128", marks=pytest.mark.slow)])
def test_sgemm_warp_variant_matches_eager_on_the_cpu_emulation(
    key: str,
    shape: dict[str, int],
    dims: dict[str, int],
    tile: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime, "load", _emu)
    params = SMALL_TILE if tile != "default" else {}
    got, expected = _run(_problem(key, shape, tmp_path), "matmul/sgemm_warp", "cuda", params)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_row_scale_float4_on_the_cpu_emulation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "load", _emu)
    cases = [
        ("level1/matmul_diag.py", {"N": 37, "M": 44}),  # the float4 kernel
        ("level1/matmul_diag.py", {"N": 13, "M": 45}),  # the scalar one
        ("diag_nonfinite", {}),  # inf and NaN in B (float4)
        ("diag_nonfinite", {"M": 43}),  # ... the scalar kernel
    ]
    for key, shape in cases:
        got, expected = _run(_problem(key, shape, tmp_path), "matmul/row_scale", "cuda", {})
        assert expected.isnan().any() or key != "diag_nonfinite"
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)


def _nvrtc_ok() -> bool:
    try:
        from kfoundry.plugins.backends.cuda_compile import nvrtc_available

        return nvrtc_available()[0]
    except Exception:  # noqa: BLE001 - no cuda extra
        return False


@pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (the cuda extra) is not installed")
@pytest.mark.parametrize(
    "key",
    [
        "level1/matmul_transposed_both.py",
        *(
            pytest.param(k, marks=pytest.mark.slow)
            for k in (
                "level1/batched_matmul.py",
                "level1/matmul_transposed_a.py",
                "level1/matmul_lower_triangular.py",
                "level1/tensor4d_matrix_einsum.py",
                "level1/matmul_diag.py",
            )
        ),
    ],
)
def test_variants_compile_for_sm90_without_spills(key: str) -> None:
    from kfoundry.plugins.backends.cuda_compile import compile_nvrtc

    problem = load_problem(DATA / key, {})  # the KernelBench sizes
    for recipe in OfflineGenerator().recipes(problem.summary(), "cuda"):
        src = "".join(f"#define {k} {v}\n" for k, v in recipe.defaults.items()) + recipe.kernel
        log = compile_nvrtc(src, "sm_90", []).log
        if recipe.name == "matmul/sgemm_warp":
            part = log.split("entry function 'matmul'")[1].split("Compile time")[0]
            spills = int(re.search(r"(\d+) bytes spill stores", part).group(1))  # type: ignore[union-attr]
            assert spills == 0, log
