"""``matmul/sgemm_warp`` (warp-tiled fp32 GEMM) as CUDA source on the CPU emulation, against eager, and
compiled for sm_90 by NVRTC (no spills in the float4 kernel, registers within MINB blocks per SM).

The shapes take every path: ragged M, N and K tails (zero fill), K and N not multiples of 4 (the 4-byte
load kernel ``matmul_u``, scalar stores), the float4 kernel, split K through the workspace, the linear
layer's weight read in place (with and without float4 loads) and each proposed tile shape.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import test_offline_matmul_async
import torch
from test_offline_matmul_async import run_emulated

from kfoundry.core.problem import load_problem
from kfoundry.core.space import ParamSpace
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

#: The tile shapes the GPU sweep times (benchmarks/h13mm_sgemm_variants.py): block, warp, thread tiles.
TILES: dict[str, dict[str, int]] = {
    "128x256_w64x64_t16x8": {
        "BM": 128,
        "BN": 256,
        "WM": 64,
        "WN": 64,
        "TM": 16,
        "TN": 8,
        "BK": 16,
        "MINB": 1,
    },
    "256x128_w64x64_t16x8": {
        "BM": 256,
        "BN": 128,
        "WM": 64,
        "WN": 64,
        "TM": 16,
        "TN": 8,
        "BK": 16,
        "MINB": 1,
    },
    "128x256_w64x64_t8x16": {
        "BM": 128,
        "BN": 256,
        "WM": 64,
        "WN": 64,
        "TM": 8,
        "TN": 16,
        "BK": 16,
        "MINB": 1,
    },
    "128x128_w64x64_t16x8": {"BM": 128, "BN": 128, "WM": 64, "WN": 64, "TM": 16, "TN": 8, "BK": 8, "MINB": 2},
    "128x128_w64x64_t8x16": {"BM": 128, "BN": 128, "WM": 64, "WN": 64, "TM": 8, "TN": 16, "BK": 8, "MINB": 2},
    "128x128_w32x64_t8x8": {"BM": 128, "BN": 128, "WM": 32, "WN": 64, "TM": 8, "TN": 8, "BK": 8, "MINB": 2},
    "128x128_w64x32_t8x8": {"BM": 128, "BN": 128, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "BK": 8, "MINB": 2},
    "128x64_w32x64_t8x8": {"BM": 128, "BN": 64, "WM": 32, "WN": 64, "TM": 8, "TN": 8, "BK": 8, "MINB": 3},
    "64x128_w32x64_t8x8": {"BM": 64, "BN": 128, "WM": 32, "WN": 64, "TM": 8, "TN": 8, "BK": 8, "MINB": 3},
}

CASES: list[tuple[str, dict[str, int], dict[str, int]]] = [
    # ragged M, N and K with K, N % 4 != 0: matmul_u (4-byte loads), scalar stores, 2 x 3 tiles
    ("level1/matmul_irregular.py", {"M": 131, "K": 37, "N": 257}, {"PAD": 0}),
    # ... the same through zero-padded copies of A and B into the float4 kernel (PAD, the default)
    ("level1/matmul_irregular.py", {"M": 131, "K": 37, "N": 257}, {}),
    ("level1/matmul_irregular.py", {"M": 67, "K": 130, "N": 61}, {"BK": 16}),
    # padded with K split over grid z (the workspace [split, M, N4])
    ("level1/matmul_large_k.py", {"M": 100, "N": 90, "K": 2047}, {"BK": 16}),
    # the float4 kernel, K tail inside a step of 16, ragged M and N, 256 threads of 8 x 8
    ("level1/matmul_irregular.py", {"M": 129, "K": 40, "N": 132}, {**TILES["128x128_w32x64_t8x8"], "BK": 16}),
    # lanes 8 x 4 (TM 8, TN 16), steps of 32, grouped block order off
    (
        "level1/matmul_irregular.py",
        {"M": 70, "K": 96, "N": 200},
        {**TILES["128x128_w64x64_t8x16"], "BK": 32, "SWZ": 0},
    ),
    # 128 x 128 tiles of 16 x 8 per thread, 256 x 128 ones, 128 x 256 ones of 8 x 16; a 64 x 128 tile
    ("level1/matmul_irregular.py", {"M": 140, "K": 24, "N": 260}, TILES["128x128_w64x64_t16x8"]),
    ("level1/matmul_irregular.py", {"M": 260, "K": 36, "N": 136}, TILES["256x128_w64x64_t16x8"]),
    ("level1/matmul_irregular.py", {"M": 136, "K": 20, "N": 264}, TILES["128x256_w64x64_t8x16"]),
    ("level1/matmul_irregular.py", {"M": 67, "K": 33, "N": 130}, TILES["64x128_w32x64_t8x8"]),
    # 128 x 64 tiles, float4 loads, no K tail; lanes 8 x 4 of 8 x 8; K below one step (only a tail step)
    ("level1/matmul_irregular.py", {"M": 200, "K": 64, "N": 72}, TILES["128x64_w32x64_t8x8"]),
    ("level1/matmul_irregular.py", {"M": 130, "K": 19, "N": 129}, {**TILES["128x128_w64x32_t8x8"], "PAD": 0}),
    ("level1/matmul_irregular.py", {"M": 20, "K": 5, "N": 36}, {"PAD": 0}),
    # one tile, long K: split over grid z into a workspace, slices added by matmul_sum
    ("level1/matmul_large_k.py", {"M": 128, "N": 128, "K": 2048}, {"BK": 16}),
    # [batch, M, K] @ [K, N] as one GEMM over batch * M rows
    ("level1/matmul_3d_2d.py", {"N": 3, "M": 50, "K": 24, "L": 36}, {}),
    # nn.Linear (weight [N, K] read in place) + bias + swish * scale epilogue: float4 and 4-byte loads
    ("level2/gemm_swish_scaling.py", {"batch_size": 40, "in_features": 48, "out_features": 136}, {}),
    ("level2/gemm_swish_scaling.py", {"batch_size": 33, "in_features": 37, "out_features": 131}, {}),
    # ... with K split in two slices (bias and epilogue in matmul_sum)
    ("level2/gemm_swish_scaling.py", {"batch_size": 20, "in_features": 1024, "out_features": 130}, {}),
]


#: kernel names the forward looked up (launched) in the current test
_LAUNCHED: list[str] = []


class _Recorder:
    def __init__(self, module: Any) -> None:
        self.module = module

    def __getattr__(self, name: str) -> Any:
        _LAUNCHED.append(name)
        return getattr(self.module, name)


def _recording_emu(*args: Any, **kw: Any) -> Any:
    return _Recorder(test_offline_matmul_async._emu_plain(*args, **kw))


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("key", "shape", "params"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_sgemm_warp_matches_eager_on_the_cpu_emulation(
    key: str, shape: dict[str, int], params: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _LAUNCHED.clear()
    monkeypatch.setattr(
        test_offline_matmul_async, "_emu_plain", test_offline_matmul_async._emu, raising=False
    )
    monkeypatch.setattr(test_offline_matmul_async, "_emu", _recording_emu)
    got, expected = run_emulated(key, shape, "matmul/sgemm_warp", params, monkeypatch)
    if shape.get("K", 0) % 4 or shape.get("N", 0) % 4:  # the kernel the shape takes
        calls = _LAUNCHED.copy()
        assert ("matmul_u" in calls) is (params.get("PAD", 1) == 0), calls
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def _nvrtc_ok() -> bool:
    try:
        from kfoundry.plugins.backends.cuda_compile import nvrtc_available

        return nvrtc_available()[0]
    except Exception:  # noqa: BLE001 - no cuda extra
        return False


@pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (the cuda extra) is not installed")
@pytest.mark.parametrize("tile", list(TILES), ids=list(TILES))
def test_sgemm_warp_compiles_for_sm90_without_spills(tile: str) -> None:
    from kfoundry.plugins.backends.cuda_compile import compile_nvrtc

    problem = load_problem(DATA / "level1/square_matmul.py", {})
    recipe = next(
        r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == "matmul/sgemm_warp"
    )
    defines = {k: int(v) for k, v in {**recipe.defaults, **TILES[tile]}.items()}
    assert ParamSpace.from_tunable(recipe.space).violation(defines) is None  # the tuner may propose it
    src = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + recipe.kernel
    log = compile_nvrtc(src, "sm_90", []).log
    nt = (defines["BM"] // defines["WM"]) * (defines["BN"] // defines["WN"]) * 32
    for kernel in ("matmul", "matmul_u"):
        part = log.split(f"entry function '{kernel}'")[1].split("Compile time")[0]
        spills = int(re.search(r"(\d+) bytes spill stores", part).group(1))  # type: ignore[union-attr]
        regs = int(re.search(r"Used (\d+) registers", part).group(1))  # type: ignore[union-attr]
        assert regs * nt * defines["MINB"] <= 65536, (kernel, regs, log)
        # the float4 kernel (every aligned shape) never spills; the 4-byte one, at 8 x 8 per thread in
        # 128 registers (two blocks of 256 threads), a few words (its clamped column indices)
        assert spills <= (0 if kernel == "matmul" else 64), (kernel, spills, log)
