"""A row reduction and its broadcast consumer in one kernel (``lower_scan.fused_rows``, the cooperative
schedule: ``x / x.abs().sum(1, keepdim=True)``, ``x / torch.norm(x, p=2, dim=1, keepdim=True)``...) on PoCL
against PyTorch in float64, where a work-group reduces its row and then applies the consumer; and its CUDA
text (clusters of 1 and 8 blocks per row) through nvcc for sm_90 without spills."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from offline_helpers import nvcc_resources
from test_offline_scan_reverse import build, problem_file, run

from kfoundry.plugins.llms.offline import cookbook_graph, lower_scan
from kfoundry.plugins.llms.offline.generator import OfflineGenerator


@pytest.fixture(scope="module", autouse=True)
def _pocl(pocl_runtime: None) -> None:
    """Every kernel here runs on PoCL."""


CASES = [
    # (forward, shape, kernels where fused, else 0)
    ("x / torch.sum(torch.abs(x), dim=1, keepdim=True)", (5, 301), 1),  # ragged: no multiple of 32
    ("x / torch.norm(x, p=2, dim=1, keepdim=True)", (3, 4099), 1),
    ("x / torch.norm(x, p=1, dim=-1, keepdim=True)", (4, 77), 1),
    ("x - x.mean(dim=-1, keepdim=True)", (6, 100), 1),
    ("x / x.sum(dim=(1, 2), keepdim=True)", (3, 7, 11), 1),  # two trailing dims
    ("(x / torch.norm(x, p=2, dim=2, keepdim=True)) * 2.0 + 1.0", (2, 3, 50), 1),  # an epilogue chain
    ("x / torch.norm(x, p=2, dim=0, keepdim=True)", (40, 6), 0),  # not the trailing dims
    ("x / torch.norm(x, p=2, dim=1)", (6, 6), 0),  # no keepdim: broadcast over the last dim
    ("x / torch.norm(x, p=2, dim=1, keepdim=True) + x.sum(dim=1, keepdim=True)", (5, 64), 2),  # two fused
]


@pytest.mark.parametrize(("forward", "shape", "fused"), CASES)
def test_fused_rows_match_torch(
    forward: str, shape: tuple[int, ...], fused: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lower_scan, "ROWS_MIN", 16)
    monkeypatch.setattr(lower_scan, "ROWS_MIN_ROWS", 1)
    problem = problem_file(tmp_path, forward, shape)
    recipe = build(problem, "graph/fused_coop", monkeypatch)
    assert ("_rows(" in recipe.kernel) is bool(fused), recipe.kernel
    if fused:
        assert recipe.kernel.count("KF_KERNEL k") == fused, recipe.kernel
    torch.manual_seed(0)
    x = torch.randn(shape) + 0.5
    got, expected = run(problem, recipe, [x])
    err = ((got - expected).abs() / (expected.abs() + 1e-3)).max().item()
    assert err < 1e-4, f"{forward}: max relative error {err}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("key", ["level1/l1_norm.py", "level1/l2_norm.py"])
def test_fused_rows_cuda_compiles_for_sm90(key: str, tmp_path: Path) -> None:
    from kfoundry.core.problem import load_problem

    data = Path(__file__).resolve().parent / "data" / "kernelbench"
    problem = load_problem(data / key, {})
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "cuda", "graph/fused_coop", 2)
    assert (
        "__cluster_dims__(KF_CL, 1, 1)" in recipe.kernel
        and "_program(KF_CL=_kf_cl, KF_PER=_kf_per)" in recipe.forward
    )
    assert len(re.findall(r"^KF_KERNEL .*\bk\d+_\w+\(", recipe.kernel, re.M)) == 1
    for cl, per in ((1, 0), (8, 0), (8, 16)):  # the loop, and the register-resident slice
        report = nvcc_resources(recipe.kernel, {**recipe.defaults, "KF_CL": cl, "KF_PER": per}, tmp_path)
        spills = [ln for ln in report.splitlines() if re.search(r"[1-9]\d* bytes spill", ln)]
        assert not spills, spills


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(
    ("key", "shape"), [("level1/l1_norm.py", (3, 500)), ("level1/l2_norm.py", (2, 1000))]
)
def test_fused_rows_cuda_text_on_the_cpu_emulation(
    key: str, shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA kernel itself (a cluster of one block per row here) through the CPU emulation of CUDA."""
    from test_offline_cuda_emulated import emu_load

    import kfoundry.runtime as runtime
    from kfoundry.core.problem import load_problem

    monkeypatch.setattr(runtime, "load", emu_load)
    monkeypatch.setattr(lower_scan, "ROWS_MIN", 16)
    monkeypatch.setattr(lower_scan, "ROWS_MIN_ROWS", 1)
    data = Path(__file__).resolve().parent / "data" / "kernelbench"
    problem = load_problem(data / key, {"batch_size": shape[0], "dim": shape[1]})
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "cuda", "graph/fused_coop", 2)
    assert "_rows(" in recipe.kernel
    namespace = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    x = torch.randn(shape) + 0.5
    with torch.no_grad():
        expected = problem.make_reference().double()(x.double())
        got = namespace["ModelNew"]()(x)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
