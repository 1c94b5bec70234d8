"""The result store: SQLite in WAL mode, schema-versioned, every write committed at once.

Core tables: ``runs``, ``candidates``, ``evaluations`` (each evaluation's full :class:`EvalRecord` as
JSON plus indexed columns), ``reference_timings``. Other components add their own tables with
:meth:`Store.ensure_table` and use :meth:`Store.execute` / :meth:`Store.query`.

Every statement runs in autocommit mode, so a process killed at any moment loses nothing that a
method had already returned from. One :class:`Store` may be shared between threads.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kfoundry.core.errors import KfError
from kfoundry.core.models import Candidate, EvalRecord, TimingStats

SCHEMA_VERSION = 1

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS runs (
        id TEXT PRIMARY KEY, created_at TEXT NOT NULL, problem TEXT NOT NULL DEFAULT '',
        status TEXT NOT NULL DEFAULT 'running', config TEXT NOT NULL DEFAULT '{}',
        summary TEXT NOT NULL DEFAULT '{}')""",
    """CREATE TABLE IF NOT EXISTS candidates (
        hash TEXT PRIMARY KEY, created_at TEXT NOT NULL, language TEXT NOT NULL, kind TEXT NOT NULL,
        parent_id TEXT, generator TEXT NOT NULL, prompt_id TEXT, label TEXT NOT NULL DEFAULT '',
        run_id TEXT, data TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS evaluations (
        id INTEGER PRIMARY KEY AUTOINCREMENT, eval_key TEXT NOT NULL, candidate_hash TEXT NOT NULL,
        run_id TEXT, problem TEXT NOT NULL, backend TEXT NOT NULL, device TEXT NOT NULL,
        outcome TEXT NOT NULL, speedup REAL, median_ms REAL, created_at TEXT NOT NULL,
        record TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS evaluations_key ON evaluations (eval_key)",
    "CREATE INDEX IF NOT EXISTS evaluations_run ON evaluations (run_id)",
    "CREATE INDEX IF NOT EXISTS candidates_run ON candidates (run_id)",
    """CREATE TABLE IF NOT EXISTS reference_timings (
        key TEXT PRIMARY KEY, created_at TEXT NOT NULL, timing TEXT NOT NULL)""",
]


class StoreError(KfError):
    """The store file cannot be opened or has an unknown schema."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class Store:
    """A SQLite result store at ``path`` (created with its parent folder if missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from None
        self._lock = threading.RLock()
        self._migrate()

    # -- generic access ----------------------------------------------------------------------------

    def _migrate(self) -> None:
        try:
            with self._lock:
                for ddl in _SCHEMA:
                    self._conn.execute(ddl)
                row = self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                if row is None:
                    self._conn.execute(
                        "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                    )
                elif int(row[0]) > SCHEMA_VERSION:
                    raise StoreError(
                        f"store {self.path} has schema {row[0]}, newer than this kfoundry ({SCHEMA_VERSION})"
                    )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"store {self.path} is not a kfoundry store: {exc}") from None

    @property
    def schema_version(self) -> int:
        return int(self.query("SELECT value FROM meta WHERE key='schema_version'")[0]["value"])

    def ensure_table(self, ddl: str) -> None:
        """Run a ``CREATE TABLE IF NOT EXISTS`` / ``CREATE INDEX IF NOT EXISTS`` statement."""
        if "IF NOT EXISTS" not in ddl.upper():
            raise StoreError("ensure_table needs a CREATE ... IF NOT EXISTS statement")
        self.execute(ddl)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run one statement (committed at once); returns the last inserted row id."""
        with self._lock:
            cur = self._conn.execute(sql, params)
            return int(cur.lastrowid or 0)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement for many rows in a single transaction."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(sql, rows)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        """Rows of a query (``row["column"]`` or ``row[0]``)."""
        with self._lock:
            return list(self._conn.execute(sql, params).fetchall())

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------------

    def save_run(
        self,
        run_id: str,
        problem: str = "",
        config: dict[str, Any] | None = None,
        status: str = "running",
        summary: dict[str, Any] | None = None,
    ) -> None:
        """Create or update a run."""
        self.execute(
            """INSERT INTO runs (id, created_at, problem, status, config, summary) VALUES (?,?,?,?,?,?)
               ON CONFLICT(id) DO UPDATE SET problem=excluded.problem, status=excluded.status,
               config=excluded.config, summary=excluded.summary""",
            (run_id, _now(), problem, status, json.dumps(config or {}), json.dumps(summary or {})),
        )

    def update_run(self, run_id: str, status: str | None = None, summary: dict[str, Any] | None = None) -> None:
        """Change a run's status and/or summary."""
        if status is not None:
            self.execute("UPDATE runs SET status=? WHERE id=?", (status, run_id))
        if summary is not None:
            self.execute("UPDATE runs SET summary=? WHERE id=?", (json.dumps(summary), run_id))

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """A run as plain data (config and summary decoded), or None."""
        rows = self.query("SELECT * FROM runs WHERE id=?", (run_id,))
        if not rows:
            return None
        row = dict(rows[0])
        row["config"] = json.loads(row["config"])
        row["summary"] = json.loads(row["summary"])
        return row

    def list_runs(self) -> list[dict[str, Any]]:
        return [self.get_run(r["id"]) or {} for r in self.query("SELECT id FROM runs ORDER BY created_at")]

    # -- candidates ---------------------------------------------------------------------------------

    def save_candidate(self, candidate: Candidate, run_id: str | None = None) -> str:
        """Store a candidate (idempotent); returns its content hash."""
        h = candidate.content_hash
        self.execute(
            """INSERT OR IGNORE INTO candidates
               (hash, created_at, language, kind, parent_id, generator, prompt_id, label, run_id, data)
               VALUES (?,?,?,?,?,?,?,?,?,?)""",
            (
                h, _now(), candidate.language, candidate.kind, candidate.parent_id, candidate.generator,
                candidate.prompt_id, candidate.label, run_id, candidate.model_dump_json(),
            ),
        )
        return h

    def get_candidate(self, content_hash: str) -> Candidate | None:
        rows = self.query("SELECT data FROM candidates WHERE hash=?", (content_hash,))
        return Candidate.model_validate_json(rows[0]["data"]) if rows else None

    def list_candidates(self, run_id: str | None = None) -> list[Candidate]:
        """Candidates in insertion order (of one run if ``run_id`` is given)."""
        if run_id is None:
            rows = self.query("SELECT data FROM candidates ORDER BY rowid")
        else:
            rows = self.query("SELECT data FROM candidates WHERE run_id=? ORDER BY rowid", (run_id,))
        return [Candidate.model_validate_json(r["data"]) for r in rows]

    # -- evaluations --------------------------------------------------------------------------------

    def save_evaluation(self, record: EvalRecord, run_id: str | None = None) -> int:
        """Append an evaluation; returns its row id."""
        return self.execute(
            """INSERT INTO evaluations (eval_key, candidate_hash, run_id, problem, backend, device, outcome,
               speedup, median_ms, created_at, record) VALUES (?,?,?,?,?,?,?,?,?,?,?)""",
            (
                record.eval_key, record.candidate_hash, run_id, record.problem, record.backend, record.device,
                record.outcome.value, record.speedup, record.timing.median_ms if record.timing else None,
                record.created_at.isoformat(), record.model_dump_json(),
            ),
        )

    def cached_evaluation(self, eval_key: str) -> EvalRecord | None:
        """The latest evaluation stored under ``eval_key`` (marked ``cached=True``), or None."""
        rows = self.query("SELECT record FROM evaluations WHERE eval_key=? ORDER BY id DESC LIMIT 1", (eval_key,))
        if not rows:
            return None
        record = EvalRecord.model_validate_json(rows[0]["record"])
        record.cached = True
        return record

    def evaluations(self, run_id: str | None = None, candidate_hash: str | None = None) -> list[EvalRecord]:
        """Stored evaluations in insertion order, optionally filtered."""
        sql, args = "SELECT record FROM evaluations WHERE 1=1", []
        if run_id is not None:
            sql += " AND run_id=?"
            args.append(run_id)
        if candidate_hash is not None:
            sql += " AND candidate_hash=?"
            args.append(candidate_hash)
        return [EvalRecord.model_validate_json(r["record"]) for r in self.query(sql + " ORDER BY id", args)]

    # -- reference timings --------------------------------------------------------------------------

    def save_reference_timing(self, key: str, timing: TimingStats) -> None:
        self.execute(
            "INSERT OR REPLACE INTO reference_timings VALUES (?,?,?)", (key, _now(), timing.model_dump_json())
        )

    def get_reference_timing(self, key: str) -> TimingStats | None:
        rows = self.query("SELECT timing FROM reference_timings WHERE key=?", (key,))
        return TimingStats.model_validate_json(rows[0]["timing"]) if rows else None
