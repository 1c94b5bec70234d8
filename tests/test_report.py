"""A real two-shape softmax run on PoCL (4 evaluations), read back: report.html, runs, show, export refusals.

The full three-shape run (export in a fresh process, the report in headless Chromium) is in
tests/test_export_shapes.py (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kfoundry
from kfoundry.api import OptimizeResult

pytestmark = pytest.mark.slow  # a real run on PoCL: about 80 s here before the first test

ROOT = Path(__file__).parents[1]
SOFTMAX = ROOT / "examples" / "kernelbench" / "softmax.py"
CLI = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
FAST = [
    "evaluation.trials=2",
    "evaluation.target_time_s=0.02",
    "evaluation.warmup_s=0.0",
    "evaluation.min_repeats=3",
    "evaluation.max_repeats=10",
    "evaluation.rotate_bytes=0",
    "evaluation.timeout_s=60",
    "evaluation.correctness_budget_s=0.0",
    "evaluation.shape_variants=0",
    "budget.proposals_per_generation=2",
    "tuner.every=-1",
]
SHAPE_SETS = [{"batch_size": 4, "dim": 64}, {"batch_size": 8, "dim": 32}]


def kf_run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> OptimizeResult:
    out = tmp_path_factory.mktemp("runs")
    return kfoundry.optimize(
        SOFTMAX,
        generations=1,
        overrides=[*FAST, "budget.evaluations=4"],
        output_dir=out,
        shape_sets=SHAPE_SETS,
    )


def test_multi_shape_run_keeps_every_shape(run: OptimizeResult) -> None:
    assert run.best is not None and run.best.is_correct and run.shape_sets == SHAPE_SETS
    assert [s.shapes for s in run.best_per_shape] == SHAPE_SETS
    speedups = [s.speedup for s in run.best_per_shape]
    assert all(s is not None and s > 0 for s in speedups)
    geo = (speedups[0] * speedups[1]) ** 0.5  # type: ignore[operator]
    assert run.best.speedup == pytest.approx(geo)
    assert json.loads((run.run_dir / "run.json").read_text())["shape_sets"] == SHAPE_SETS


def test_report_is_written_at_the_end_and_self_contained(run: OptimizeResult) -> None:
    assert run.report == run.run_dir / "report.html"
    text = run.report.read_text()
    assert run.best is not None
    best_line = next(line for line in run.best.source.splitlines() if "__kernel" in line)
    assert best_line.replace('"', "&quot;").replace("'", "&#x27;") in text or best_line in text
    for anchor in (
        "progress",
        "archive",
        "lineage",
        "roofline",
        "outcomes",
        "tuning",
        "llm",
        "shapes",
        "source",
    ):
        assert f'id="{anchor}"' in text
    assert "batch_size=4, dim=64" in text and "batch_size=8, dim=32" in text  # the per-shape table
    assert "<script src=" not in text and "plotly.js v" in text  # the bundle is inlined, nothing is fetched
    assert text.count('class="kf-chart"') >= 4
    again = kf_run("report", str(run.run_dir), "-o", str(run.run_dir / "again.html"))
    assert again.returncode == 0 and (run.run_dir / "again.html").stat().st_size > 1_000_000


def test_runs_and_show(run: OptimizeResult) -> None:
    listed = kf_run("runs", str(run.run_dir.parent), "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert (
        row["status"] == "finished" and row["problem"] == "softmax" and row["evaluations"] == run.evaluations
    )
    assert row["best_speedup"] == pytest.approx(run.best.speedup if run.best else 0)
    shown = kf_run("show", str(run.run_dir), "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert run.best is not None and data["candidate"]["source"] == run.best.source
    assert data["verdict"]["outcome"] == "correct" and len(data["verdict"]["per_shape"]) == 2
    assert len(data["evaluations"]) >= 2  # one stored evaluation per shape set
    other = data["top"][-1]["id"]
    one = kf_run("show", str(run.run_dir), "--candidate", other[:10])
    assert one.returncode == 0 and other[:16] in one.stdout
    bad = kf_run("show", str(run.run_dir), "--candidate", "nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no candidate with id 'nope'" in bad.stderr
    missing = kf_run("show", str(run.run_dir / "missing"))
    assert missing.returncode == 2 and "not a kfoundry run folder" in missing.stderr


def test_export_refuses_bad_targets_in_one_line(run: OptimizeResult, tmp_path: Path) -> None:
    bad = kf_run("export", str(run.run_dir), "--to", str(tmp_path / "not-a-name"))
    assert bad.returncode == 2 and "not a Python package name" in bad.stderr and bad.stderr.count("\n") == 1
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    busy = kf_run("export", str(run.run_dir), "--to", str(tmp_path / "busy"))
    assert busy.returncode == 2 and "not an earlier kfoundry export" in busy.stderr
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
