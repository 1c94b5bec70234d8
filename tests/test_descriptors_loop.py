"""The loop follows the run's descriptor choice: measured cells on PoCL, the archive's axes, resume."""

from __future__ import annotations

import json
import textwrap

import pytest
from eval_helpers import LOOP_FAST_EVAL as FAST_EVAL

from kfoundry.core.behaviour.llvm_ir import find_clang
from kfoundry.core.behaviour.run import DescriptorMismatch
from kfoundry.core.loop import OptimizeLoop, new_run_dir

MATMUL = """
import torch
import torch.nn as nn

M = 32
K = 24
N = 32


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, N)]


def get_init_inputs():
    return []
"""


@pytest.mark.slow
@pytest.mark.skipif(find_clang() is None, reason="no LLVM clang to compile OpenCL C to IR")
def test_measured_run_records_its_axes_and_resumes_under_them(kf_config, kf_problem) -> None:
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    path = kf_problem(textwrap.dedent(MATMUL), name="desc_matmul")
    sets = [
        "budget.generations=1",
        "budget.proposals_per_generation=2",
        "tuner.every=-1",
        "search.options.islands=1",
        *FAST_EVAL,
    ]
    config = kf_config({"search": {"options": {"descriptors": "measured"}}}, *sets)
    run_id, run_dir = new_run_dir(config, "desc_matmul")
    problem = load_problem(path, {})
    store = Store(run_dir / "kfoundry.db")

    def loop_for(cfg):  # type: ignore[no-untyped-def]
        evaluator = Evaluator(problem, cfg, store, run_id)
        return OptimizeLoop(cfg, problem, evaluator, store, run_id, run_dir, initial_proposals=3)

    loop = loop_for(config)
    assert loop.space.names == ("intensity", "hierarchy", "mix", "occupancy")
    loop.run()
    archive = loop.strategy.archive
    assert archive.dims == (4, 4, 4, 4) and archive.axis_names() == list(loop.space.names)
    cells = list(archive)
    assert cells and all(len(c.coords) == 4 for c in cells)
    measured = [c for c in cells if c.record.descriptors.get("measured") == 1.0]
    assert measured, "no elite was measured"
    assert all("hierarchy" in c.record.descriptors and "level_mix" in c.record.descriptors for c in measured)
    # cells differ along measured axes: the recipes are not all one kind of kernel
    assert len({tuple(c.coords) for c in cells}) == len(cells)
    stored = json.loads(store.query("SELECT data FROM loop_state WHERE run_id=?", (run_id,))[0]["data"])
    assert [a["name"] for a in stored["strategy"]["archive"]["axes"]] == list(loop.space.names)

    resumed = loop_for(config)  # the same choice: the archive comes back as it was
    assert [(c.coords, c.candidate.content_hash) for c in resumed.strategy.archive] == [
        (c.coords, c.candidate.content_hash) for c in cells
    ]
    with pytest.raises(
        DescriptorMismatch, match="laid out on descriptors \\(intensity, hierarchy, mix, occupancy\\)"
    ):
        loop_for(kf_config({}, *sets))  # static now: refused in one line


@pytest.mark.slow
@pytest.mark.skipif(find_clang() is None, reason="no LLVM clang to compile OpenCL C to IR")
def test_traffic_pass_places_correct_records_by_their_traffic(kf_config, kf_problem, monkeypatch) -> None:
    """With ``search.options.profile = "on"`` every correct record gets the pass's traffic (a stand-in
    for ncu here, the real sandboxed pass otherwise) and its cell is the one that traffic gives."""
    from pathlib import Path

    from kfoundry.core.behaviour.traffic import measured_hierarchy
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    monkeypatch.setenv("KF_NCU", str(Path(__file__).parent / "data" / "fake_ncu.sh"))
    path = kf_problem(textwrap.dedent(MATMUL), name="traffic_matmul")
    sets = ["budget.generations=1", "budget.proposals_per_generation=1", "tuner.every=-1", *FAST_EVAL]
    config = kf_config({"search": {"options": {"descriptors": "measured", "profile": "on"}}}, *sets)
    run_id, run_dir = new_run_dir(config, "traffic_matmul")
    problem = load_problem(path, {})
    store = Store(run_dir / "kfoundry.db")
    evaluator = Evaluator(problem, config, store, run_id)
    loop = OptimizeLoop(config, problem, evaluator, store, run_id, run_dir, initial_proposals=2)
    assert loop.space.profiler is not None
    loop.run()
    cells = list(loop.strategy.archive)
    assert cells
    for cell in cells:
        d = cell.record.descriptors
        assert d["traffic_measured"] == 1.0 and d["intensity"] == d["measured_intensity"]
        assert d["hierarchy"] == measured_hierarchy(d["static_hierarchy"], d)
        assert tuple(cell.coords) == loop.space.cell(cell.candidate)
        assert cell.coords[0] == int(d["level_intensity"])
