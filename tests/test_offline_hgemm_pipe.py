"""``matmul/mma_pipe`` (fp16/bf16 tensor-core GEMM, cp.async stages, double-buffered ldmatrix fragments).

On the CPU emulation (no sm_80) the copies are synchronous, ``ldmatrix`` is emulated from the lanes' own row
addresses (exchanged by warp shuffles, as the instruction gathers them) and each MMA from shuffles of the
fragments in the PTX layout, so the ldmatrix addressing, the fragment layouts, the stage ring, the
fragment double buffer, the zero fill past M, N and K and the scalar fallback are what is checked; nvcc
checks the sm_90 build (registers, no spills) of every tile shape.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from offline_helpers import nvcc_resources
from test_offline_matmul_async import run_emulated

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
NAME = "matmul/mma_pipe"

_SLOW = pytest.mark.slow
CASES: list = [
    # one 128 x 256 block: ragged M and N, K a tail inside one 32-deep tile
    ("level1/matmul_bf16.py", {"M": 37, "K": 24, "N": 40}, {}),
    # 128 x 128 x 32 tiles, 4 k tiles through 3 stages (the ring wraps once), K a tail in the last
    ("level1/square_matmul_fp16.py", {"N": 104}, {"BN": 128, "STAGES": 3, "SWZ": 0}),
    # 128 x 128 x 64 tiles, 3 stages: a K tail in the third tile, N past one column tile
    pytest.param(
        "level1/square_matmul_fp16.py", {"N": 136}, {"BN": 128, "BK": 64, "STAGES": 3, "SWZ": 0}, marks=_SLOW
    ),
    # 7 k tiles through 4 stages, 2 x 2 blocks in SWZ groups, ragged M and N
    pytest.param("level1/matmul_bf16.py", {"M": 136, "K": 216, "N": 264}, {}, marks=_SLOW),
    # N % 8 != 0: the scalar kernel of the same program
    ("level1/matmul_bf16.py", {"M": 9, "K": 16, "N": 12}, {}),
]


def _case_id(case: object) -> str:
    values = case.values if hasattr(case, "values") else case  # type: ignore[union-attr]
    return f"{values[0]}-{values[1]}-{values[2]}"


def _recipe(key: str) -> object:
    problem = load_problem(DATA / key, {})
    return next(r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == NAME)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("key", "shape", "params"), CASES, ids=[_case_id(c) for c in CASES])
def test_mma_pipe_matches_eager_on_the_cpu_emulation(
    key: str, shape: dict[str, int], params: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    got, expected = run_emulated(key, shape, NAME, params, monkeypatch)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)


def test_mma_pipe_outranks_mma_tiles_on_cuda_only() -> None:
    problem = load_problem(DATA / "level1/matmul_bf16.py", {})
    ranks = {r.name: r.rank for r in OfflineGenerator().recipes(problem.summary(), "cuda")}
    assert ranks[NAME] > ranks["matmul/mma_tiles"]
    assert NAME not in {r.name for r in OfflineGenerator().recipes(problem.summary(), "opencl")}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize(
    ("key", "params"),
    [
        ("level1/matmul_bf16.py", {}),
        ("level1/square_matmul_fp16.py", {}),
        ("level1/square_matmul_fp16.py", {"BN": 256, "BK": 64, "STAGES": 3}),
        ("level1/matmul_bf16.py", {"BN": 128, "BK": 64, "STAGES": 4}),
    ],
    ids=["bf16", "fp16", "fp16-bk64", "bf16-bn128"],
)
def test_mma_pipe_compiles_for_sm90_without_spills(key: str, params: dict[str, int], tmp_path: Path) -> None:
    recipe = _recipe(key)
    report = nvcc_resources(recipe.kernel, {**recipe.defaults, **params}, tmp_path)  # type: ignore[attr-defined]
    entry = report.split("'matmul'")[1]
    assert " 0 bytes spill stores" in entry, report
    used = re.search(r"Used (\d+) registers", entry)
    assert used and int(used.group(1)) <= 255, report
