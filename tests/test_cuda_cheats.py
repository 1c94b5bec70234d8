"""The GPU cheat catalogue (tests/data/bad_cuda/): every entry's header is well-formed and its CUDA
source compiles here (NVRTC, no GPU needed); on a machine with a GPU every cheat is caught
(``benchmarks/cuda_trust_cheats.py`` runs the same check and prints the table, see benchmarks/NOTES.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from test_eval_catalogue import parse

from kfoundry.plugins.backends.cuda import CudaBackend, CudaOptions
from kfoundry.plugins.backends.cuda_compile import nvrtc_available

ROOT = Path(__file__).resolve().parents[1]
CHEATS = sorted((ROOT / "tests/data/bad_cuda").glob("g*.py"))


def _kernel_sources(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Constant)
        and any(getattr(t, "id", "") == "SRC" for t in n.targets)
    ]


def test_catalogue_is_complete() -> None:
    assert len(CHEATS) >= 10
    for path in CHEATS:
        entry = parse("bad_cuda", path)
        assert entry is not None and entry.description, path
        assert "correct" not in entry.expect or entry.max_speedup is not None, (
            f"{path}: correct needs max_speedup"
        )


@pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC is not installed (extra `cuda`)")
@pytest.mark.parametrize("path", CHEATS, ids=[p.stem for p in CHEATS])
def test_cheat_compiles(path: Path) -> None:
    backend = CudaBackend(CudaOptions(compiler="nvrtc", compile_only=True))
    sources = _kernel_sources(path)
    assert sources, f"{path}: no SRC kernel source"
    for source in sources:
        module = backend.load(source)
        assert module.resources, path


def _has_gpu() -> bool:
    return CudaBackend().capabilities().can_run


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _has_gpu(), reason="needs an NVIDIA GPU (run benchmarks/cuda_trust_cheats.py there)")
def test_every_cheat_is_caught_on_the_gpu() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/cuda_trust_cheats.py")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| NO |" not in done.stdout, done.stdout[-4000:]
