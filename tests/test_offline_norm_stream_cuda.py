"""The CUDA norm stream (group norm's fused_coop kernel at full size): the next ticket and piece taken
under the current piece's work, a row's statistics loaded once per work-group, one multiply-add an
element where a piece has one affine pair; it compiles for sm_90 without spills at two 256-item
work-groups an SM (the 264-work-group grid resident)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from tests.offline_helpers import nvcc_resources


def _kernel() -> str:
    p = load_problem(Path("tests/data/kernelbench/level1/group_norm.py"), {})
    got = [r.kernel for r in OfflineGenerator().recipes(p.summary(), "cuda") if r.name == "graph/fused_coop"]
    assert got and "_stream(" in got[0]
    return got[0]


def test_stream_overlaps_ticket_and_caches_row() -> None:
    k = _kernel()
    assert k.count("atomicAdd(ws, 1)") == 2  # the first ticket, then each next one inside the loop
    assert "row != crow" in k and "kf_sc" in k and "kf_wsum(s1)" in k


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_stream_compiles_without_spills(tmp_path: Path) -> None:
    report = nvcc_resources(_kernel(), {"BLOCK": 256}, tmp_path)
    assert "0 bytes spill stores" in report
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert regs and max(regs) <= 128, report
