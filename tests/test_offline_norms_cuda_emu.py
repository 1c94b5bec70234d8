"""The norm rows' CUDA kernels on the CPU emulation of ``test_offline_cuda_emulated`` (slow; g++ C++20):
instance and group norm's one-kernel stream (fused_coop: tickets, arrivals, the row's last piece merging
its pieces, flags; the emulation runs blocks one after another, so one block takes every ticket), the
three-kernel path (fused), cross-entropy's one-read rows, and layer norm's split_rows_vec with float4
affine parameters, all with random affine parameters, against float64 PyTorch."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import test_offline_cuda_emulated as emu
import torch

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

#: what the stream needs beyond the emulation's CUDA subset
_EXTRA = r"""
static inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
static inline void __nanosleep(unsigned) {}
"""

CASES: list[tuple[Any, ...]] = [
    (
        "level1/instance_norm.py",
        {"batch_size": 2, "features": 3, "dim1": 100, "dim2": 92},
        "graph/fused_coop",
        "_stream(",
    ),
    (
        "level1/group_norm.py",
        {"batch_size": 2, "features": 6, "num_groups": 3, "dim1": 50, "dim2": 90},
        "graph/fused_coop",
        "_stream(",
    ),
    (
        "level1/group_norm.py",
        {"batch_size": 2, "features": 6, "num_groups": 2, "dim1": 45, "dim2": 91},
        "graph/fused_coop",
        "_stream(",
    ),
    (
        "level1/group_norm.py",
        {"batch_size": 2, "features": 6, "num_groups": 3, "dim1": 50, "dim2": 90},
        "graph/fused",
        "_fold(",
    ),
    # the stream's swept parameters: pieces of 8192 (a row of one whole piece and a short one), 3 per SM
    (
        "level1/instance_norm.py",
        {"batch_size": 2, "features": 3, "dim1": 100, "dim2": 92},
        "graph/fused_coop",
        "_stream(",
        {"SP": 2, "SW": 3},
    ),
    (
        "level1/batch_norm.py",
        {"batch_size": 3, "features": 4, "dim1": 64, "dim2": 68},
        "graph/fused_coop",
        "_fold(",
    ),
    ("level1/cross_entropy.py", {"batch_size": 7, "num_classes": 1500}, "graph/fused_coop", "kf_s[BLOCK]"),
    ("level1/cross_entropy.py", {"batch_size": 5, "num_classes": 1030}, "graph/fused", "kf_s[BLOCK]"),
    (
        "level1/layer_norm_4d.py",
        {"batch_size": 3, "features": 4, "dim1": 64, "dim2": 36},
        "layer_norm/split_rows_vec",
        "wq",
    ),
]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_norm_cuda_on_the_cpu_emulation(case: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    key, shape, name, marker = case[:4]
    params: dict[str, int] = case[4] if len(case) > 4 else {}
    monkeypatch.setattr(emu, "EMU_H", emu.EMU_H + _EXTRA)
    monkeypatch.setattr(runtime, "load", emu.emu_load)
    problem = load_problem(DATA / key, shape)
    recipe = next(r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == name)
    assert marker in recipe.kernel
    torch.manual_seed(0)
    reference = problem.make_reference()
    inputs = problem.make_inputs(1)
    if "norm" in key:
        inputs = [300.0 + 0.5 * inputs[0]]  # a mean far from zero
    namespace: dict[str, Any] = {"PARAMS": {**recipe.defaults, **params}, "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for (pname, a), b in zip(reference.named_parameters(), model.parameters(), strict=True):
            v = (
                torch.randn(a.shape, generator=gen)
                if pname.endswith("bias")
                else 0.5 + torch.rand(a.shape, generator=gen)
            )
            a.copy_(v)
            b.copy_(v)
        expected = reference.double()(*[x.double() if x.is_floating_point() else x for x in inputs])
        got = model(*inputs)
    assert got.shape == expected.shape
    err = (got.double() - expected).abs().max().item()
    assert err < 2e-3, f"{key} {name}: max error {err}"
