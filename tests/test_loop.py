"""The optimize loop end to end on PoCL: real evaluations, the store, export, kill -9 and resume."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from eval_helpers import LOOP_FAST_EVAL as FAST_EVAL

from kfoundry.core.commands.optimize import run_loop
from kfoundry.core.loop import OptimizeLoop, new_run_dir, read_run_file, write_run_file

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


def test_loop_runs_end_to_end(kf_config, kf_problem, tmp_path: Path) -> None:
    from rich.console import Console

    path = kf_problem(textwrap.dedent(MATMUL), name="tiny_matmul")
    config = kf_config(
        {},
        "budget.generations=2",
        "budget.proposals_per_generation=2",
        "tuner.every=-1",
        "search.options.islands=2",
        *FAST_EVAL,
    )
    run_id, run_dir = new_run_dir(config, "tiny_matmul")
    write_run_file(run_dir, run_id, path, {}, config, None)
    console = Console(record=True, width=160)
    summary = run_loop(config, path, {}, run_id, run_dir, None, console)
    assert summary.best is not None and summary.best.record.is_correct
    assert summary.generations == 2 and summary.stop_reason.startswith("all 2 generations")
    db = sqlite3.connect(run_dir / "kfoundry.db")
    rows = db.execute("SELECT generation, record FROM loop_proposals WHERE run_id=?", (run_id,)).fetchall()
    assert len(rows) == summary.evaluations and all(r[1] for r in rows)
    assert {r[0] for r in rows} == {0, 1}
    assert db.execute("SELECT COUNT(*) FROM archive_cells WHERE run_id=?", (run_id,)).fetchone()[0] >= 2
    status = db.execute("SELECT status FROM runs WHERE id=?", (run_id,)).fetchone()[0]
    assert status == "finished"
    exported = summary.exported
    assert exported is not None and exported.read_text().count("PARAMS = {") == 1
    text = console.export_text()
    assert "archive" in text and "best kernel:" in text
    assert read_run_file(run_dir)["run_id"] == run_id


def test_unsupported_problem_is_one_line(kf_problem, tmp_path: Path) -> None:
    path = kf_problem(
        textwrap.dedent("""
        import torch
        import torch.nn as nn
        class Model(nn.Module):
            def forward(self, x):
                return torch.sort(x, dim=0)[0]
        def get_inputs(): return [torch.rand(64)]
        def get_init_inputs(): return []
    """),
        name="sort",
    )
    proc = subprocess.run(
        ["kf-run", str(path), "--set", f"output_dir={tmp_path}"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not a known operation family" in lines[0]


def _evaluated(db_path: Path) -> list[tuple[int, int, str]]:
    if not db_path.exists():
        return []
    try:
        db = sqlite3.connect(db_path, timeout=10)
        rows = db.execute(
            "SELECT generation, idx, evaluated_at FROM loop_proposals WHERE record IS NOT NULL ORDER BY 1, 2"
        ).fetchall()
        db.close()
        return [tuple(r) for r in rows]
    except sqlite3.OperationalError:  # tables not created yet
        return []


@pytest.mark.slow
def test_kill_9_then_resume_loses_and_repeats_nothing(kf_problem, tmp_path: Path) -> None:
    path = kf_problem(textwrap.dedent(MATMUL), name="kill_matmul")
    out = tmp_path / "runs"
    sets = [
        f"output_dir={out}",
        "budget.generations=3",
        "budget.proposals_per_generation=3",
        "tuner.every=-1",
        *FAST_EVAL,
    ]
    args = ["kf-run", str(path)] + [x for s in sets for x in ("--set", s)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        db_path = None
        while time.monotonic() < deadline:
            dbs = list(out.glob("*/kfoundry.db"))
            db_path = dbs[0] if dbs else None
            if db_path is not None and len(_evaluated(db_path)) >= 5:
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited early"
            time.sleep(0.2)
        else:
            pytest.fail("the run did not reach 5 evaluations in time")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert db_path is not None
    before = _evaluated(db_path)
    run_dir = db_path.parent
    resumed = subprocess.run(["kf-run", "resume", str(run_dir)], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = _evaluated(db_path)
    assert set(before) <= set(after)  # nothing already evaluated was evaluated again (same timestamps)
    db = sqlite3.connect(db_path)
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    planned = db.execute("SELECT COUNT(*) FROM loop_proposals WHERE run_id=?", (run_id,)).fetchone()[0]
    assert len(after) == planned and {g for g, _, _ in after} == {0, 1, 2}
    distinct = db.execute(
        "SELECT COUNT(DISTINCT candidate_hash) FROM loop_proposals WHERE run_id=?", (run_id,)
    ).fetchone()[0]
    stored = db.execute("SELECT COUNT(*) FROM evaluations WHERE run_id=?", (run_id,)).fetchone()[0]
    assert stored <= distinct + 1  # at most the evaluation in flight at the kill ran twice
    assert (
        json.loads(db.execute("SELECT data FROM loop_state WHERE run_id=?", (run_id,)).fetchone()[0])[
            "status"
        ]
        == "finished"
    )
    assert "best kernel:" in resumed.stdout


def test_loop_budget_on_evaluations_is_exact(kf_config, kf_problem) -> None:
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    path = kf_problem(textwrap.dedent(MATMUL), name="budget_matmul")
    config = kf_config(
        {},
        "budget.generations=5",
        "budget.proposals_per_generation=3",
        "budget.evaluations=4",
        "tuner.every=-1",
        "search.name=ga",
        *FAST_EVAL,
    )
    run_id, run_dir = new_run_dir(config, "budget_matmul")
    problem = load_problem(path, {})
    store = Store(run_dir / "kfoundry.db")
    loop = OptimizeLoop(config, problem, Evaluator(problem, config, store, run_id), store, run_id, run_dir)
    summary = loop.run()
    assert summary.evaluations == 4 and "evaluation budget" in summary.stop_reason


def test_resume_of_a_folder_that_is_not_a_run_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(["kf-run", "resume", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path}: not a kfoundry run folder (no run.json)"


def test_wall_time_budget_stops_before_the_next_evaluation(kf_config, kf_problem) -> None:
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    path = kf_problem(textwrap.dedent(MATMUL), name="wall_matmul")
    config = kf_config({}, "budget.wall_time_s=10", "tuner.every=-1", *FAST_EVAL)
    run_id, run_dir = new_run_dir(config, "wall_matmul")
    problem = load_problem(path, {})
    store = Store(run_dir / "kfoundry.db")
    ticks = iter(range(0, 10_000, 4))  # every clock read advances 4 "seconds"
    loop = OptimizeLoop(
        config,
        problem,
        Evaluator(problem, config, store, run_id),
        store,
        run_id,
        run_dir,
        clock=lambda: float(next(ticks)),
    )
    summary = loop.run()
    assert "wall time budget" in summary.stop_reason
    assert 1 <= summary.evaluations <= 2


def test_tuning_stage_runs_inside_the_loop(kf_config, kf_problem) -> None:
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    path = kf_problem(textwrap.dedent(MATMUL), name="tune_matmul")
    config = kf_config(
        {},
        "budget.generations=1",
        "tuner.every=1",
        "tuner.name=random",
        "tuner.evaluations=3",
        "tuner.elites=1",
        *FAST_EVAL,
    )
    run_id, run_dir = new_run_dir(config, "tune_matmul")
    problem = load_problem(path, {})
    store = Store(run_dir / "kfoundry.db")
    loop = OptimizeLoop(
        config,
        problem,
        Evaluator(problem, config, store, run_id),
        store,
        run_id,
        run_dir,
        initial_proposals=3,
    )
    summary = loop.run()
    tuned = store.query("SELECT generation, result FROM loop_tuning WHERE run_id=?", (run_id,))
    assert [r["generation"] for r in tuned] == [0]  # after generation 0, not again at the end
    assert json.loads(tuned[0]["result"])["evaluations"] == 3
    assert loop.state.tuning_evaluations == 3 and summary.evaluations == 3 + 3
    assert 0 in loop.state.tuned_generations
