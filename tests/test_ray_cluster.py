"""A real two-node Ray cluster on 127.0.0.1 (``ray start --head`` plus a worker node): ``kf-run`` runs
through it, the worker node is killed mid-run, and the run still completes with every evaluation
stored once."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from eval_helpers import EXAMPLES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed"),
]

RAY = str(Path(sys.executable).with_name("ray"))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    # a token file left by another local Ray would switch the head to token auth, which `ray start
    # --address` does not pass on: this private cluster runs without it
    return dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


class Cluster:
    """A head node and one worker node, each in its own process group (killed by group)."""

    def __init__(self) -> None:
        self.port = _port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp = tempfile.mkdtemp(prefix="kfray", dir="/tmp")  # short: Ray's socket paths must fit
        head = subprocess.Popen(
            [
                RAY,
                "start",
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={self.port}",
                "--num-cpus=1",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={self.temp}",
            ],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        out, _ = head.communicate(timeout=180)
        self.head_group = head.pid
        assert head.returncode == 0, out[-2000:]
        self.worker = subprocess.Popen(
            [
                RAY,
                "start",
                f"--address={self.address}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
                "--block",
                "--disable-usage-stats",
            ],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_for_nodes(2)

    def _wait_for_nodes(self, n: int) -> None:
        code = (
            f"import ray; ray.init(address='{self.address}', log_to_driver=False); "
            "print(sum(1 for x in ray.nodes() if x['Alive']))"
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            got = subprocess.run(
                [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120
            )
            if got.returncode == 0 and got.stdout.strip().splitlines()[-1:] == [str(n)]:
                return
            time.sleep(2)
        pytest.fail(f"the Ray cluster did not reach {n} nodes")

    def kill_worker(self) -> None:
        _kill_group(self.worker.pid)
        self.worker.wait()

    def close(self) -> None:
        self.kill_worker()
        _kill_group(self.head_group)
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


def _evaluated(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return int(
                conn.execute("SELECT COUNT(*) FROM loop_proposals WHERE record IS NOT NULL").fetchone()[0]
            )
    except sqlite3.OperationalError:
        return 0


def test_kf_run_survives_the_death_of_a_worker_node(cluster: Cluster, tmp_path: Path) -> None:
    problem = EXAMPLES / "kernelbench" / "vector_add.py"
    out = tmp_path / "runs"
    sets = [
        f"output_dir={out}",
        "executor.name=ray",
        f"executor.options.address={cluster.address}",
        "budget.generations=2",
        "budget.proposals_per_generation=4",
        "tuner.every=-1",
        "evaluation.trials=2",
        "evaluation.target_time_s=0.005",
        "evaluation.warmup_s=0.0",
        "evaluation.min_repeats=3",
        "evaluation.max_repeats=10",
        "evaluation.rotate_bytes=0",
        "evaluation.correctness_budget_s=0.0",
    ]
    args = [sys.executable, "-m", "kfoundry.core.cli", str(problem), "--shape", "N=4096"]
    args += [x for s in sets for x in ("--set", s)]
    code = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
    args[1:3] = ["-c", code]
    run = subprocess.Popen(
        args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and run.poll() is None:
            dbs = list(out.glob("*/kfoundry.db"))
            if dbs and _evaluated(dbs[0]) >= 2:
                break
            time.sleep(0.5)
        assert run.poll() is None, (run.stdout.read() if run.stdout else "")[-3000:]
        cluster.kill_worker()  # mid-run: the tasks on that node die with it
        output, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            _kill_group(run.pid)
    assert run.returncode == 0, output[-3000:]
    [db_path] = list(out.glob("*/kfoundry.db"))
    db = sqlite3.connect(db_path)
    run_id = json.loads((db_path.parent / "run.json").read_text())["run_id"]
    rows = db.execute("SELECT record FROM loop_proposals WHERE run_id=?", (run_id,)).fetchall()
    records = [json.loads(r[0]) for r in rows if r[0]]
    assert rows and len(records) == len(rows)  # nothing lost: every proposal has its verdict
    twice = db.execute(
        "SELECT eval_key, COUNT(*) FROM evaluations WHERE run_id=? GROUP BY eval_key HAVING COUNT(*) > 1",
        (run_id,),
    ).fetchall()
    assert twice == []  # every finished evaluation stored once
    assert not any(r["message"].startswith("setup:") for r in records), [r["message"] for r in records]
    assert any(r["outcome"] == "correct" for r in records)
    retried = sum(int(r.get("resources", {}).get("ray_retries", 0)) for r in records)
    print(f"{len(records)} evaluations, {retried} ray task retries after the worker node died")
