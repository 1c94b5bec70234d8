"""The one schema of the run store: every table, a version number and the ordered migrations.

A store records its version in ``meta`` (key ``schema_version``). Opening a store applies, in one
transaction each, the migrations newer than its version; a store newer than this kfoundry is refused.
Version 1 is the schema of the first releases (the core tables; the other tables were then made by
each component when it first ran, with the same statements), so version 2 creates what a version-1
store may lack with ``IF NOT EXISTS``. A later change appends a migration (``ALTER TABLE ...``) and
never edits an old one.

Why a list of our own rather than alembic: the store is one SQLite file opened through ``sqlite3`` in
autocommit mode with WAL and a run lock; alembic needs an engine, an environment script and a
versions folder, and its SQLite migrations rebuild tables in "batch mode". The list below is the
whole mechanism, and every migration is a plain statement a reader can check against a store.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from dataclasses import dataclass

_CORE = (
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
)

_COMPONENTS = (
    # the optimize loop: its state, every proposal and verdict, the archive, tuning results
    "CREATE TABLE IF NOT EXISTS loop_state (run_id TEXT PRIMARY KEY, data TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS loop_proposals (
        run_id TEXT NOT NULL, generation INTEGER NOT NULL, idx INTEGER NOT NULL, candidate TEXT,
        candidate_hash TEXT, ask TEXT NOT NULL, generator TEXT NOT NULL, rationale TEXT NOT NULL DEFAULT '',
        parse_error TEXT, coords TEXT, record TEXT, evaluated_at TEXT,
        PRIMARY KEY (run_id, generation, idx))""",
    """CREATE TABLE IF NOT EXISTS archive_cells (
        run_id TEXT NOT NULL, island INTEGER NOT NULL, coords TEXT NOT NULL, candidate_hash TEXT NOT NULL,
        label TEXT NOT NULL, outcome TEXT NOT NULL, speedup REAL, median_ms REAL, fitness REAL NOT NULL,
        migrated INTEGER NOT NULL, PRIMARY KEY (run_id, island, coords))""",
    """CREATE TABLE IF NOT EXISTS loop_tuning (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, generation INTEGER NOT NULL,
        candidate_hash TEXT NOT NULL, result TEXT NOT NULL)""",
    # language models: every call, the ensemble's votes, the evolving prompt variants
    """CREATE TABLE IF NOT EXISTS llm_calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, seq INTEGER NOT NULL, member TEXT NOT NULL,
        provider TEXT NOT NULL, model TEXT NOT NULL, kind TEXT NOT NULL, request_key TEXT NOT NULL,
        occurrence INTEGER NOT NULL, prompt_hash TEXT NOT NULL, system TEXT NOT NULL, prompt TEXT NOT NULL,
        response TEXT, tokens_in INTEGER NOT NULL, tokens_out INTEGER NOT NULL, cost_usd REAL NOT NULL,
        latency_s REAL NOT NULL, attempts INTEGER NOT NULL, error TEXT, error_kind TEXT, generation INTEGER,
        created_at TEXT NOT NULL, data TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS llm_calls_run ON llm_calls (run_id)",
    """CREATE TABLE IF NOT EXISTS llm_votes (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, generation INTEGER NOT NULL, proposals TEXT NOT NULL,
        scores TEXT NOT NULL, points TEXT NOT NULL, kept TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS prompts (
        id TEXT PRIMARY KEY, run_id TEXT, parent_id TEXT, generation INTEGER NOT NULL, section TEXT,
        sections TEXT NOT NULL, uses INTEGER NOT NULL, best_fitness REAL, outcomes TEXT NOT NULL)""",
    # tuning: every trial, and the performance records that warm-start later tunings
    """CREATE TABLE IF NOT EXISTS tuner_trials (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, tuning_id TEXT, candidate_hash TEXT,
        tuner TEXT, idx INTEGER, params TEXT, time_ms REAL, invalidity TEXT, message TEXT, seeded INTEGER)""",
    """CREATE TABLE IF NOT EXISTS perf_records (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, problem TEXT, kernel TEXT, backend TEXT,
        device TEXT, shapes TEXT, params TEXT, time_ms REAL, created TEXT)""",
)


@dataclass(frozen=True)
class Migration:
    """The statements that bring a store from ``version - 1`` to ``version``."""

    version: int
    what: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "the core tables: runs, candidates, evaluations, reference timings", _CORE),
    Migration(2, "every component's table in the one schema (made by each component before)", _COMPONENTS),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


class SchemaError(Exception):
    """A store's schema is newer than this kfoundry, or its version cannot be read."""


def stored_version(conn: sqlite3.Connection) -> int:
    """The version a store records (0: a new store, or one that never recorded it)."""
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
    if not has_meta:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None:
        return 0
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise SchemaError(f"unreadable schema version {row[0]!r}") from None


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations ``conn``'s store lacks (each in one transaction); returns the version found.

    ``conn`` is in autocommit mode. Two processes opening one new store at once are serialised by
    ``BEGIN IMMEDIATE``; the second finds the work done. A store at the current version is not written.
    """
    found = stored_version(conn)
    if found > SCHEMA_VERSION:
        raise SchemaError(f"schema {found}, newer than this kfoundry ({SCHEMA_VERSION})")
    for migration in MIGRATIONS:
        if migration.version <= found:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            if stored_version(conn) < migration.version:  # another process may have just done it
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (str(migration.version),),
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # the error that stopped it is what must be seen
                    conn.execute("ROLLBACK")
            raise
    return found


@functools.cache
def expected_columns() -> dict[str, frozenset[str]]:
    """The columns of every table at :data:`SCHEMA_VERSION`, as the migrations create them."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        tables = [t for t in tables if not t.startswith("sqlite_")]
        return {t: frozenset(r[1] for r in conn.execute(f"PRAGMA table_info({t})")) for t in tables}
    finally:
        conn.close()


def missing_columns(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """Per table of the schema, the columns ``conn``'s store lacks (a damaged or foreign store)."""
    out: dict[str, list[str]] = {}
    for table, columns in expected_columns().items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if not columns <= have:
            out[table] = sorted(columns - have)
    return out
