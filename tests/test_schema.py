"""The one schema: every table in one module, versioned migrations, and a store written by the first
schema (version 1) opening and resuming.

``tests/data/store_v1`` is a run folder left by kfoundry before the schema module (commit 3eea9a0):
``kf-run tiny_matmul.py`` for one generation with a tuning stage, its store compressed. Its store has
``schema_version`` 1 and only the tables that run made (no ``llm_calls``, ``prompts``, ...).
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kfoundry.core.db import loop as loop_db
from kfoundry.core.db import schema
from kfoundry.core.store import Store

ROOT = Path(__file__).resolve().parent.parent
V1 = ROOT / "tests/data/store_v1"
V1_RUN = json.loads((V1 / "run.json").read_text())["run_id"]


def _v1_folder(tmp_path: Path) -> Path:
    """A copy of the version-1 run folder whose run file points at the copied problem."""
    folder = tmp_path / V1_RUN
    folder.mkdir()
    with gzip.open(V1 / "kfoundry.db.gz") as src, (folder / "kfoundry.db").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    problem = shutil.copy(V1 / "tiny_matmul.py", tmp_path / "tiny_matmul.py")
    info = json.loads((V1 / "run.json").read_text())
    info["problem"] = str(problem)
    info["config"]["output_dir"] = str(tmp_path)
    (folder / "run.json").write_text(json.dumps(info))
    return folder


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")} - {
            "sqlite_sequence"
        }


def test_one_module_creates_every_table() -> None:
    pkg = ROOT / "kfoundry"
    holders = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if "CREATE TABLE" in p.read_text())
    assert holders == ["core/db/schema.py"]


def test_a_new_store_has_every_table_at_the_current_version(tmp_path: Path) -> None:
    with Store(tmp_path / "kf.db") as store:
        assert store.schema_version == schema.SCHEMA_VERSION == schema.MIGRATIONS[-1].version
    assert _tables(tmp_path / "kf.db") == set(schema.expected_columns())
    assert {"loop_proposals", "llm_calls", "llm_votes", "prompts", "tuner_trials", "perf_records"} <= _tables(
        tmp_path / "kf.db"
    )


def test_a_version_1_store_migrates_and_keeps_its_rows(tmp_path: Path) -> None:
    db = _v1_folder(tmp_path) / "kfoundry.db"
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("1",)
        before = {t: raw.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in _tables(db)}
    assert "llm_calls" not in before and before["loop_proposals"] > 0 and before["tuner_trials"] > 0
    with Store(db) as store:
        assert store.schema_version == schema.SCHEMA_VERSION
        rows = loop_db.proposals(store, V1_RUN)
        assert len(rows) == before["loop_proposals"] and all(r.record is not None for r in rows)
        assert store.get_run(V1_RUN)["status"] == "finished"  # type: ignore[index]
        assert len(loop_db.tuning_results(store, V1_RUN)) == before["loop_tuning"]
    assert _tables(db) == set(schema.expected_columns())
    with sqlite3.connect(db) as raw:
        assert {t: raw.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in before} == before


def test_a_failing_migration_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Store(tmp_path / "kf.db").close()
    bad = schema.Migration(
        schema.SCHEMA_VERSION + 1, "test", ("CREATE TABLE half (a)", "INSERT INTO nope VALUES (1)")
    )
    monkeypatch.setattr(schema, "MIGRATIONS", (*schema.MIGRATIONS, bad))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", bad.version)
    conn = sqlite3.connect(tmp_path / "kf.db", isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="nope"):
        schema.migrate(conn)
    assert schema.stored_version(conn) == bad.version - 1
    assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name='half'").fetchone()
    conn.close()


@pytest.mark.slow
def test_a_version_1_run_folder_resumes(tmp_path: Path) -> None:
    folder = _v1_folder(tmp_path)
    db = folder / "kfoundry.db"
    with sqlite3.connect(db) as raw:
        done = raw.execute(
            "SELECT generation, idx, evaluated_at FROM loop_proposals ORDER BY 1, 2"
        ).fetchall()
    proc = subprocess.run(
        [sys.executable, "-c", "from kfoundry.core.cli import main; main()", "resume", str(folder), "--set", "budget.generations=2",
         "--set", "budget.evaluations=9"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    with sqlite3.connect(db) as raw:
        after = raw.execute(
            "SELECT generation, idx, evaluated_at FROM loop_proposals ORDER BY 1, 2"
        ).fetchall()
        state = json.loads(raw.execute("SELECT data FROM loop_state WHERE run_id=?", (V1_RUN,)).fetchone()[0])
        version = raw.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    assert set(done) < set(after)  # generation 0's verdicts kept as they were, generation 1 begun
    assert {g for g, _, at in after if at} == {0, 1}
    assert state["status"] == "finished" and "evaluation budget (9)" in state["stop_reason"]
    assert version == str(schema.SCHEMA_VERSION)
