"""Shape-range dispatch of an exported package on PoCL: a shape-generic kernel is probed at export and
covers the range between (and below) the shapes it was tuned on, chosen at call time by nearness; one
with its size baked in keeps its own shape; outside every range the reference runs, with one warning."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from kfoundry.core.report import dispatch
from kfoundry.core.report.ranges import add_ranges, probe_shapes, size_names

ROOT = Path(__file__).parents[1]
SOFTMAX = ROOT / "examples" / "kernelbench" / "softmax.py"
GENERIC = ROOT / "examples" / "kernelbench" / "improved" / "softmax_opencl.py"
#: Correct at dim=256 only: the size is baked in (rows are cut to 256 columns).
BAKED = """import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.zeros_like(x)
        y[:, :256] = torch.softmax(x[:, :256], dim=1)
        return y
"""
SETS = [{"batch_size": 8, "dim": 256}, {"batch_size": 32, "dim": 1024}]


def _entry(kernel: str, shapes: dict, device: str, params: dict) -> dict:
    return {
        "shapes": shapes, "input_shapes": [[shapes["batch_size"], shapes["dim"]]], "input_dtypes": ["float32"],
        "backend": "opencl", "device": device, "kernel": kernel, "kind": "kernelbench", "language": "opencl",
        "label": kernel, "candidate_id": kernel, "params": params,
    }  # fmt: skip


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kfoundry.runtime import active_backend

    device = active_backend().select_device(None).key
    to = tmp_path_factory.mktemp("pkg")
    (to / "kernels").mkdir()
    shutil.copyfile(SOFTMAX, to / "reference.py")
    shutil.copyfile(dispatch.__file__, to / "_dispatch.py")
    shutil.copyfile(GENERIC, to / "kernels" / "generic.py")
    (to / "kernels" / "baked.py").write_text(BAKED)
    entries = [
        _entry("kernels/generic.py", SETS[0], device, {"VW": 8}),
        _entry("kernels/generic.py", SETS[1], device, {"VW": 4}),
        _entry("kernels/baked.py", {"batch_size": 4, "dim": 256}, device, {}),
    ]
    table = {
        "problem": "softmax",
        "run_id": "r",
        "reference": "reference.py",
        "entries": entries,
        "rejected": [],
    }
    (to / "table.json").write_text(json.dumps(table))
    add_ranges(to, entries, SETS, atol=1e-5, rtol=1e-5)
    (to / "table.json").write_text(json.dumps(table))
    return to


def test_probes_span_the_run_with_ragged_and_tiny_sizes() -> None:
    assert size_names(SETS, {"batch_size": 8, "dim": 256}) == ["batch_size", "dim"]
    assert size_names([{}], {"batch_size": 64, "dim": 4096, "eps": 1e-5, "axis": 1}) == ["batch_size", "dim"]
    probes = probe_shapes({"batch_size": 8, "dim": 256}, SETS, ["batch_size", "dim"])
    assert probes[:2] == SETS and {"batch_size": 7, "dim": 7} in probes
    ragged = probes[3]
    assert 8 < ragged["batch_size"] < 32 and 256 < ragged["dim"] < 1024 and ragged["dim"] % 2 == 1
    assert dispatch.covers([[[4, 8], [7, 1024]]], [[5, 1000]]) and not dispatch.covers(
        [[[4, 8], [7, 1024]]], [[9, 10]]
    )
    assert not dispatch.covers(None, [[5, 10]]) and not dispatch.covers([[[4, 8]]], [[5, 10]])


def test_generic_kernels_get_ranges_baked_ones_do_not(package: Path) -> None:
    entries = json.loads((package / "table.json").read_text())["entries"]
    assert entries[0]["input_ranges"] == [[[7, 32], [7, 1024]]] == entries[1]["input_ranges"]
    assert "input_ranges" not in entries[2]  # correct at dim=256 only: exact


def test_calls_in_range_run_the_nearest_kernel_and_others_the_reference(package: Path) -> None:
    d = dispatch.Dispatcher(package)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for (b, n), want in [
            ((8, 256), "kernel:kernels/generic.py"),  # exact
            ((4, 256), "kernel:kernels/baked.py"),  # exact: the baked kernel's own shape
            ((10, 300), "kernel:kernels/generic.py"),  # in range, nearest the first set
            ((30, 999), "kernel:kernels/generic.py"),  # in range, nearest the second
            ((7, 33), "kernel:kernels/generic.py"),  # below the tuned shapes, down to the tiny probe
            ((64, 4096), "reference: no kernel for input shapes [[64, 4096]]"),
            ((3, 5), "reference: no kernel for input shapes [[3, 5]]"),
            ((8, 256), "kernel:kernels/generic.py"),  # again: a kernel runs every time, not only once
        ]:
            x = torch.rand(b, n)
            assert torch.allclose(d(x), torch.softmax(x, 1), atol=1e-5), (b, n)
            assert d.last_choice == want, (b, n)
    assert [d.select(torch.rand(b, n))[0] for b, n in [(10, 300), (30, 999)]] == [0, 1]
    # one warning per kind of miss (others, such as an OpenCL compiler's notes when a kernel builds here
    # for the first time in the session, are not the dispatcher's)
    assert len([w for w in caught if issubclass(w.category, dispatch.DispatchWarning)]) == 2
