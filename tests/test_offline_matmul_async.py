"""``matmul/sgemm_async`` (cp.async fp32 GEMM) as CUDA source on the CPU emulation, against eager.

The emulation (tests/test_offline_cuda_emulated.py) has no sm_80, so the copies run synchronously: what
is checked here is the tiling, the transposed A tile, the zero fill past M, N and K, the stage ring, the
split-K workspace and the epilogue, at shapes that take every path (ragged edges, N % 4 != 0, split K).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from test_offline_cuda_emulated import emu_load

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

#: The emulation's dynamic shared memory is its static ``g_dyn`` buffer.
_DYN = {
    "KF_SMEM_DECL": "float* kf_smem = reinterpret_cast<float*>(g_dyn);",
    "KF_HSMEM_DECL": "unsigned short* kf_hsmem = reinterpret_cast<unsigned short*>(g_dyn);",
}


def _emu(source: str, defines: dict[str, Any] | None = None, build_options: list[str] | None = None) -> Any:
    return emu_load(source, {**(defines or {}), **_DYN}, build_options)


def run_emulated(
    key: str, shape: dict[str, int], name: str, params: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output of recipe ``name`` at ``params`` on the CPU emulation, eager output)."""
    monkeypatch.setattr(runtime, "load", _emu)
    small = json.loads((DATA / "small_shapes.json").read_text())
    problem = load_problem(DATA / key, shape or small.get(key, {}))
    recipe = next(r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == name)
    torch.manual_seed(0)
    reference = problem.make_reference()
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = reference(*inputs)
    namespace: dict[str, Any] = {"PARAMS": {**recipe.defaults, **params}, "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        got = model(*inputs)
    return got, expected


CASES: list[tuple[str, dict[str, int], dict[str, int]]] = [
    # ragged M, N and K, N % 4 != 0 (4-byte copies of B, scalar stores), two tile rows and columns
    ("level1/matmul_irregular.py", {"M": 131, "K": 37, "N": 257}, {}),
    # N % 4 == 0 (16-byte copies, float4 stores), the other thread layout, 2 stages of 8
    (
        "level1/matmul_irregular.py",
        {"M": 129, "K": 40, "N": 132},
        {"LAYOUT": 0, "BK": 8, "STAGES": 2, "SWZ": 0},
    ),
    # one tile, long K: split over grid z into a workspace, slices added by matmul_sum
    ("level1/matmul_large_k.py", {"M": 128, "N": 128, "K": 2048}, {"BK": 32, "STAGES": 4, "MINB": 1}),
    # [batch, M, K] @ [K, N] as one GEMM over batch * M rows
    ("level1/matmul_3d_2d.py", {"N": 3, "M": 50, "K": 24, "L": 36}, {}),
    # nn.Linear (weight transposed first) + bias + swish * scale epilogue
    ("level2/gemm_swish_scaling.py", {"batch_size": 40, "in_features": 48, "out_features": 136}, {}),
    # ... with K split in two slices (the weight read [N, K] in place, bias and epilogue in matmul_sum)
    ("level2/gemm_swish_scaling.py", {"batch_size": 20, "in_features": 1024, "out_features": 130}, {}),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("key", "shape", "params"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_sgemm_async_matches_eager_on_the_cpu_emulation(
    key: str, shape: dict[str, int], params: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    got, expected = run_emulated(key, shape, "matmul/sgemm_async", params, monkeypatch)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("params", [{}, {"BK": 8, "STAGES": 4, "LAYOUT": 0}], ids=["defaults", "bk8"])
def test_sgemm_async_compiles_for_sm90_without_spills(params: dict[str, int], tmp_path: Path) -> None:
    problem = load_problem(DATA / "level1/square_matmul.py", {})
    recipe = next(
        r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == "matmul/sgemm_async"
    )
    defines = {**recipe.defaults, **params}
    src = tmp_path / "k.cu"
    src.write_text("".join(f"#define {k} {v}\n" for k, v in defines.items()) + recipe.kernel)
    cmd = ["nvcc", "-arch=sm_90", "-cubin", "--resource-usage", "-o", str(tmp_path / "k.cubin"), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.stdout + proc.stderr
    assert "cp.async" not in report and " 0 bytes spill stores" in report, report
    assert re.search(r"Used (\d+) registers", report.split("'matmul'")[1]), report


#: fp16/bf16 on the tensor-core recipe: ragged M and N tiles, a K tail inside a 32-deep step, two steps,
#: and N % 8 != 0 (the scalar kernel of the same program).
HALF_CASES: list[tuple[str, dict[str, int], dict[str, int]]] = [
    ("level1/matmul_bf16.py", {"M": 37, "K": 24, "N": 40}, {}),
    ("level1/square_matmul_fp16.py", {"N": 48}, {"STAGES": 2, "SWZ": 0}),
    ("level1/matmul_bf16.py", {"M": 9, "K": 16, "N": 12}, {}),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("key", "shape", "params"), HALF_CASES, ids=[f"{c[0]}-{c[1]}" for c in HALF_CASES])
def test_mma_tiles_match_eager_on_the_cpu_emulation(
    key: str, shape: dict[str, int], params: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    got, expected = run_emulated(key, shape, "matmul/mma_tiles", params, monkeypatch)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)
