"""The result store: SQLite in WAL mode, schema-versioned, every write committed at once.

The tables, their version and migrations are :mod:`kfoundry.core.db.schema`; opening a store brings it
to the current version. This class holds the connection and the core tables' repository methods
(``runs``, ``candidates``, ``evaluations`` with each full :class:`EvalRecord` as JSON plus indexed
columns, ``reference_timings``); the other tables' repositories are the modules of
:mod:`kfoundry.core.db`, which use :meth:`Store.execute` / :meth:`Store.query`.

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
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kfoundry.core.db.lock import RunLock, describe_cause, first_error
from kfoundry.core.db.schema import SCHEMA_VERSION, SchemaError, migrate, missing_columns
from kfoundry.core.errors import StoreError
from kfoundry.core.models import Candidate, EvalRecord, TimingStats

__all__ = ["SCHEMA_VERSION", "RunLock", "Store", "StoreError"]

_M = TypeVar("_M", bound=BaseModel)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class Store:
    """A SQLite result store at ``path`` (created with its parent folder if missing).

    ``lock=True`` takes the run folder's :class:`RunLock` first (a second writer is refused in one
    line); ``create=False`` refuses a store that is missing or empty instead of starting a new one.
    Every SQLite or file-system failure (full disk, read-only folder, damaged file) is a
    :class:`StoreError` naming the path and the cause; nothing already stored is lost by one.
    """

    def __init__(self, path: str | Path, *, lock: bool = False, create: bool = True) -> None:
        self.path = Path(path)
        self._run_lock: RunLock | None = None
        if not create and (not self.path.is_file() or self.path.stat().st_size == 0):
            state = "empty" if self.path.is_file() else "missing"
            raise StoreError(f"store {self.path} is {state}: nothing to resume from")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the folder of store {self.path}: {describe_cause(exc, self.path)}"
            ) from None
        if self.path.parent.is_dir() is False:
            raise StoreError(f"cannot open store {self.path}: {self.path.parent} is not a folder")
        if lock:
            self._run_lock = RunLock(self.path.with_name(self.path.name + ".lock"))
        try:
            self._conn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=30.0
            )
        except (OSError, sqlite3.Error) as exc:
            self._release()
            raise StoreError(f"cannot open store {self.path}: {describe_cause(exc, self.path)}") from None
        try:
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
        except (OSError, sqlite3.Error, UnicodeDecodeError) as exc:
            self._conn.close()  # a connection left open would keep SQLite's locks on the file
            self._release()
            raise StoreError(f"cannot open store {self.path}: {describe_cause(exc, self.path)}") from None
        self._lock = threading.RLock()
        try:
            self._migrate()
        except StoreError:
            self._conn.close()
            self._release()
            raise

    def _release(self) -> None:
        if self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    def _fail(self, exc: sqlite3.Error | UnicodeDecodeError, what: str) -> StoreError:
        return StoreError(f"store {self.path}: cannot {what}: {describe_cause(exc, self.path)}")

    # -- generic access ----------------------------------------------------------------------------

    def _migrate(self) -> None:
        try:
            with self._lock:
                migrate(self._conn)
                for table, lacking in missing_columns(self._conn).items():
                    raise StoreError(
                        f"store {self.path} is damaged: table {table} lacks column(s) {', '.join(lacking)}"
                    )
        except SchemaError as exc:
            raise StoreError(f"store {self.path} has {exc}") from None
        except sqlite3.OperationalError as exc:
            raise StoreError(f"cannot open store {self.path}: {describe_cause(exc, self.path)}") from None
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"store {self.path} is not a kfoundry store: {exc}") from None
        except UnicodeDecodeError as exc:
            raise StoreError(f"store {self.path} is damaged: {describe_cause(exc, self.path)}") from None

    @property
    def schema_version(self) -> int:
        return int(self.query("SELECT value FROM meta WHERE key='schema_version'")[0]["value"])

    def ensure_table(self, ddl: str) -> None:
        """A plugin's own table or index (``CREATE ... IF NOT EXISTS``); kfoundry's are all in the schema."""
        if "IF NOT EXISTS" not in ddl.upper():
            raise StoreError("ensure_table needs a CREATE ... IF NOT EXISTS statement")
        self.execute(ddl)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run one statement (committed at once); returns the last inserted row id."""
        with self._lock:
            try:
                cur = self._conn.execute(sql, params)
            except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
                if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError):
                    raise
                raise self._fail(exc, "write") from None
            return int(cur.lastrowid or 0)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement for many rows in a single transaction."""
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                try:
                    self._conn.executemany(sql, rows)
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
                if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError):
                    raise
                raise self._fail(exc, "write") from None

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        """Rows of a query (``row["column"]`` or ``row[0]``)."""
        with self._lock:
            try:
                return list(self._conn.execute(sql, params).fetchall())
            except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
                if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError):
                    raise
                raise self._fail(exc, "read") from None

    def decode(self, model: type[_M], text: Any, where: str) -> _M:
        """A stored JSON row as ``model``; an unreadable row is one :class:`StoreError` line naming it."""
        try:
            return model.model_validate_json(text)
        except (ValidationError, ValueError, TypeError, RecursionError) as exc:
            raise StoreError(f"store {self.path}: {where} is unreadable: {first_error(exc)}") from None

    def decode_json(self, text: Any, where: str) -> Any:
        """A stored JSON column as data; an unreadable one is one :class:`StoreError` line naming it."""
        try:
            return json.loads(text)
        except (ValueError, TypeError, RecursionError) as exc:
            raise StoreError(f"store {self.path}: {where} is unreadable: {first_error(exc)}") from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self._release()

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

    def update_run(
        self, run_id: str, status: str | None = None, summary: dict[str, Any] | None = None
    ) -> None:
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
        for column in ("config", "summary"):
            row[column] = self.decode_json(row[column], f"runs row {run_id!r}, column {column}")
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
                h,
                _now(),
                candidate.language,
                candidate.kind,
                candidate.parent_id,
                candidate.generator,
                candidate.prompt_id,
                candidate.label,
                run_id,
                candidate.model_dump_json(),
            ),
        )
        return h

    def get_candidate(self, content_hash: str) -> Candidate | None:
        rows = self.query("SELECT data FROM candidates WHERE hash=?", (content_hash,))
        return self.decode(Candidate, rows[0]["data"], f"candidates row {content_hash}") if rows else None

    def list_candidates(self, run_id: str | None = None) -> list[Candidate]:
        """Candidates in insertion order (of one run if ``run_id`` is given)."""
        if run_id is None:
            rows = self.query("SELECT data FROM candidates ORDER BY rowid")
        else:
            rows = self.query("SELECT data FROM candidates WHERE run_id=? ORDER BY rowid", (run_id,))
        return [self.decode(Candidate, r["data"], "a candidates row") for r in rows]

    # -- evaluations --------------------------------------------------------------------------------

    def save_evaluation(self, record: EvalRecord, run_id: str | None = None) -> int:
        """Append an evaluation; returns its row id."""
        return self.execute(
            """INSERT INTO evaluations (eval_key, candidate_hash, run_id, problem, backend, device, outcome,
               speedup, median_ms, created_at, record) VALUES (?,?,?,?,?,?,?,?,?,?,?)""",
            (
                record.eval_key,
                record.candidate_hash,
                run_id,
                record.problem,
                record.backend,
                record.device,
                record.outcome.value,
                record.speedup,
                record.timing.median_ms if record.timing else None,
                record.created_at.isoformat(),
                record.model_dump_json(),
            ),
        )

    def cached_evaluation(self, eval_key: str) -> EvalRecord | None:
        """The latest evaluation stored under ``eval_key`` (marked ``cached=True``), or None."""
        rows = self.query(
            "SELECT record FROM evaluations WHERE eval_key=? ORDER BY id DESC LIMIT 1", (eval_key,)
        )
        if not rows:
            return None
        record = self.decode(EvalRecord, rows[0]["record"], f"an evaluations row (key {eval_key[:16]})")
        record.cached = True
        return record

    def has_evaluation(self, eval_key: str, run_id: str | None) -> bool:
        """Whether an evaluation under ``eval_key`` is stored for ``run_id`` (None: for no run)."""
        rows = self.query(
            "SELECT 1 FROM evaluations WHERE eval_key=? AND run_id IS ? LIMIT 1", (eval_key, run_id)
        )
        return bool(rows)

    def evaluations(self, run_id: str | None = None, candidate_hash: str | None = None) -> list[EvalRecord]:
        """Stored evaluations in insertion order, optionally filtered."""
        sql, args = "SELECT id, record FROM evaluations WHERE 1=1", []
        if run_id is not None:
            sql += " AND run_id=?"
            args.append(run_id)
        if candidate_hash is not None:
            sql += " AND candidate_hash=?"
            args.append(candidate_hash)
        rows = self.query(sql + " ORDER BY id", args)
        return [self.decode(EvalRecord, r["record"], f"evaluations row {r['id']}") for r in rows]

    def copy_evaluations_from(self, other: Store) -> int:
        """Copy ``other``'s evaluations (without their run) and reference timings into this store, so
        they serve as its evaluation cache; returns the evaluations copied."""
        columns = "eval_key, candidate_hash, problem, backend, device, outcome, speedup, median_ms, created_at, record"
        rows = other.query(f"SELECT {columns} FROM evaluations ORDER BY id")
        self.executemany(
            f"INSERT INTO evaluations ({columns}) VALUES ({','.join('?' * 10)})", [tuple(r) for r in rows]
        )
        refs = other.query("SELECT key, created_at, timing FROM reference_timings")
        self.executemany("INSERT OR REPLACE INTO reference_timings VALUES (?,?,?)", [tuple(r) for r in refs])
        return len(rows)

    # -- reference timings --------------------------------------------------------------------------

    def save_reference_timing(self, key: str, timing: TimingStats) -> None:
        self.execute(
            "INSERT OR REPLACE INTO reference_timings VALUES (?,?,?)", (key, _now(), timing.model_dump_json())
        )

    def get_reference_timing(self, key: str) -> TimingStats | None:
        rows = self.query("SELECT timing FROM reference_timings WHERE key=?", (key,))
        return (
            self.decode(TimingStats, rows[0]["timing"], f"reference_timings row {key[:16]}") if rows else None
        )
