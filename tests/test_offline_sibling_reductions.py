"""Sibling reductions read once (:mod:`kfoundry.plugins.llms.offline.lower_group`): long reductions over
the same iteration space share ONE first-stage kernel (each input read once for all of them); a
reduction that reads another's value waits for it; sources of one traced shape that differ at run time
are refused in ``forward``, not summed past their end. Real OpenCL kernels on PoCL and the CUDA
cooperative variant on the CPU emulation, against eager PyTorch."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import test_offline_cuda_emulated as emu
import torch
from offline_helpers import pointwise_problem, run_against_eager

import kfoundry.runtime as runtime
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

#: (forward, input shapes, first-stage kernels expected): rows long enough for the split path (8192+)
CASES = [
    # a row's max (keepdim) and min (no keepdim): one read of x
    (
        "x0 - x0.max(dim=-1, keepdim=True).values + torch.min(x0, dim=-1).values.unsqueeze(-1)",
        [(3, 9001)],
        1,
    ),
    # three folds of two inputs over all elements (flat: rows of 100 < ROW_MIN) and one of a single input
    ("(x0 * x1).sum() + x0.abs().amax() - (x1 * x1).mean() + x0.amin()", [(96, 100), (96, 100)], 1),
    # the second reads the first's value: two first stages, in order
    ("(x0 - x0.amax(dim=-1, keepdim=True)).exp().sum(dim=-1)", [(2, 12000)], 2),
    # a matrix product of the pending value: its kernel names its output before the group is emitted
    ("x0.amax(dim=-1).unsqueeze(0) @ x1 + x0.sum(dim=-1).unsqueeze(0) @ x1", [(4, 9000), (4, 5)], 2),
    # the L2 norms of two inputs over the middle and last dims (rows of 4100: quads and a scalar tail)
    ("x0.norm(dim=(1, 2)) * x1.abs().sum(dim=(1, 2))", [(2, 3, 4100), (2, 3, 4100)], 1),
]


def _first_stages(source: str) -> list[str]:
    return re.findall(r"KF_KERNEL (k\d+_\w*(?:gpart|piece))\(", source)


def _graph(problem: Any, lang: str, name: str) -> Any:
    return next(r for r in OfflineGenerator().recipes(problem.summary(), lang) if r.name == name)


@pytest.mark.parametrize(("forward", "shapes", "stages"), CASES, ids=[c[0][:40] for c in CASES])
def test_siblings_share_one_first_stage(tmp_path: Path, forward: str, shapes: Any, stages: int) -> None:
    problem = pointwise_problem(tmp_path, forward, shapes)
    for lang, name in (("opencl", "graph/fused"), ("cuda", "graph/fused_coop")):
        source = _graph(problem, lang, name).kernel
        assert len(_first_stages(source)) == stages, (lang, _first_stages(source))
        if stages == 1 and len(re.findall(r"\.(?:max|min|amax|amin|sum|mean|norm)\(", forward)) > 1:
            assert "groupgpart" in source


@pytest.mark.usefixtures("pocl_runtime")
@pytest.mark.parametrize(("forward", "shapes", "stages"), CASES, ids=[c[0][:40] for c in CASES])
def test_siblings_match_eager_on_pocl(tmp_path: Path, forward: str, shapes: Any, stages: int) -> None:
    problem = pointwise_problem(tmp_path, forward, shapes)
    got, expected = run_against_eager(problem, _graph(problem, "opencl", "graph/fused"))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("forward", "shapes", "stages"), CASES, ids=[c[0][:40] for c in CASES])
def test_siblings_match_eager_on_the_cpu_emulation(
    tmp_path: Path, forward: str, shapes: Any, stages: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "load", emu.emu_load)
    monkeypatch.setattr(runtime, "synchronize", lambda: None)
    problem = pointwise_problem(tmp_path, forward, shapes)
    namespace: dict[str, Any] = {}
    recipe = _graph(problem, "cuda", "graph/fused_coop")
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": emu.emu_load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = problem.make_reference()(*inputs)
        got = namespace["ModelNew"](*problem.make_init_inputs())(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.usefixtures("pocl_runtime")
def test_siblings_of_inputs_that_differ_at_run_time_are_refused(tmp_path: Path) -> None:
    """x0 and x1 are traced at one shape; called with a shorter x1, the shared kernel would read past its
    end: ``forward`` raises instead."""
    problem = pointwise_problem(tmp_path, "x0.sum(dim=-1) + x1.amax(dim=-1)", [(2, 9000), (2, 9000)])
    recipe = _graph(problem, "opencl", "graph/fused")
    assert "groupgpart" in recipe.kernel
    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    model = namespace["ModelNew"]()
    with torch.no_grad():
        ok = model(torch.ones(2, 9000), torch.ones(2, 9000))
        runtime.synchronize()
        torch.testing.assert_close(ok, torch.full((2,), 9001.0))
        with pytest.raises(ValueError, match="sibling reductions"):
            model(torch.ones(2, 9000), torch.ones(2, 8000))
