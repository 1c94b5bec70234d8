"""The SQLite store: schema, runs, candidates, evaluations, cache lookups, extension tables, kills."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kfoundry.core.models import Candidate, EvalRecord, Outcome, TimingStats
from kfoundry.core.store import SCHEMA_VERSION, Store, StoreError


def _record(key: str, outcome: Outcome = Outcome.correct, speedup: float | None = 2.0) -> EvalRecord:
    timing = TimingStats(
        median_ms=1.0, iqr_ms=0.1, ci95_low_ms=0.9, ci95_high_ms=1.1, mean_ms=1.0, min_ms=0.9, n=10
    )
    return EvalRecord(
        candidate_hash="c1",
        eval_key=key,
        problem="p",
        backend="opencl",
        device="opencl:cpu",
        outcome=outcome,
        timing=timing,
        speedup=speedup,
    )


def test_wal_and_schema_version(tmp_path: Path) -> None:
    store = Store(tmp_path / "sub" / "kf.sqlite")
    assert store.schema_version == SCHEMA_VERSION
    assert store.query("PRAGMA journal_mode")[0][0] == "wal"
    store.close()
    raw = sqlite3.connect(tmp_path / "sub" / "kf.sqlite")
    raw.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="newer than this kfoundry"):
        Store(tmp_path / "sub" / "kf.sqlite")


def test_not_a_store(tmp_path: Path) -> None:
    bad = tmp_path / "junk.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="file is not a database"):
        Store(bad)


def test_runs_candidates_evaluations_roundtrip(tmp_path: Path) -> None:
    with Store(tmp_path / "kf.sqlite") as store:
        store.save_run("r1", problem="softmax", config={"seed": 1})
        store.update_run("r1", status="done", summary={"best": 2.0})
        run = store.get_run("r1")
        assert run is not None and run["status"] == "done" and run["summary"] == {"best": 2.0}
        assert run["config"] == {"seed": 1} and store.get_run("nope") is None
        cand = Candidate(source="x", params={"BLOCK": 64}, generator="offline")
        h = store.save_candidate(cand, run_id="r1")
        assert store.save_candidate(cand, run_id="r1") == h
        assert store.get_candidate(h) == cand and store.list_candidates("r1") == [cand]
        store.save_evaluation(_record("k1"), run_id="r1")
        store.save_evaluation(_record("k1", Outcome.mismatch, None), run_id="r1")
        cached = store.cached_evaluation("k1")
        assert cached is not None and cached.cached and cached.outcome is Outcome.mismatch
        assert store.cached_evaluation("k2") is None
        assert [r.outcome for r in store.evaluations(run_id="r1")] == [Outcome.correct, Outcome.mismatch]
        store.save_reference_timing("ref", _record("x").timing)  # type: ignore[arg-type]
        assert store.get_reference_timing("ref") == _record("x").timing


def test_evaluations_by_run_and_copied_as_a_cache(tmp_path: Path) -> None:
    with Store(tmp_path / "a.sqlite") as old, Store(tmp_path / "b.sqlite") as fresh:
        old.save_evaluation(_record("k1"), run_id="r1")
        old.save_reference_timing("ref", _record("x").timing)  # type: ignore[arg-type]
        assert old.has_evaluation("k1", "r1") and not old.has_evaluation("k1", None)
        assert not old.has_evaluation("k2", "r1")
        assert fresh.copy_evaluations_from(old) == 1
        assert fresh.has_evaluation("k1", None)  # copied without its run: a cache for the new one
        cached = fresh.cached_evaluation("k1")
        assert cached is not None and cached.cached and fresh.get_reference_timing("ref") is not None


def test_extension_tables(tmp_path: Path) -> None:
    with Store(tmp_path / "kf.sqlite") as store:
        store.ensure_table("CREATE TABLE IF NOT EXISTS archive (cell TEXT PRIMARY KEY, fitness REAL)")
        store.ensure_table("CREATE TABLE IF NOT EXISTS archive (cell TEXT PRIMARY KEY, fitness REAL)")
        store.execute("INSERT INTO archive VALUES (?, ?)", ("0,1,2", 5.5))
        store.executemany("INSERT INTO archive VALUES (?, ?)", [("1,1,1", 1.0), ("2,2,2", 2.0)])
        assert [r["cell"] for r in store.query("SELECT cell FROM archive ORDER BY fitness DESC")] == [
            "0,1,2",
            "2,2,2",
            "1,1,1",
        ]
        with pytest.raises(StoreError, match="IF NOT EXISTS"):
            store.ensure_table("CREATE TABLE t (x)")


WRITER = textwrap.dedent(
    """
    import sys
    from kfoundry.core.store import Store
    from kfoundry.core.models import EvalRecord, Outcome
    store = Store(sys.argv[1])
    i = 0
    while True:
        store.save_evaluation(EvalRecord(candidate_hash="c", eval_key=f"k{i}", problem="p", backend="b",
                                         device="d", outcome=Outcome.correct))
        i += 1
        if i == 50:
            print("50", flush=True)
    """
)


def test_killed_writer_loses_nothing_committed(tmp_path: Path) -> None:
    db = tmp_path / "kf.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "50"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with Store(db) as store:
        keys = [r["eval_key"] for r in store.query("SELECT eval_key FROM evaluations ORDER BY id")]
    assert len(keys) >= 50
    assert keys == [f"k{i}" for i in range(len(keys))]
