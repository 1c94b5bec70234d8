"""The tuning tables: every tuner trial (``tuner_trials``) and the performance records
(``perf_records``: correct, timed configurations with what they were measured on) that warm-start
later tunings."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kfoundry.core.store import Store

_PERF = "SELECT problem, kernel, device, shapes, params, time_ms FROM perf_records"


def insert_trial(
    store: Store,
    run_id: str | None,
    tuning_id: str,
    candidate_hash: str,
    tuner: str,
    *,
    index: int,
    params: Mapping[str, Any],
    time_ms: float | None,
    invalidity: str,
    message: str,
    seeded: bool,
) -> None:
    """Append one trial of one tuning (``tuning_id``); ``invalidity`` is ``correct`` for a valid one."""
    store.execute(
        "INSERT INTO tuner_trials (run_id, tuning_id, candidate_hash, tuner, idx, params, time_ms, invalidity,"
        " message, seeded) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id,
            tuning_id,
            candidate_hash,
            tuner,
            index,
            json.dumps(dict(params)),
            time_ms,
            invalidity,
            message[:500],
            int(seeded),
        ),
    )


def insert_perf_record(
    store: Store,
    run_id: str | None,
    *,
    problem: str,
    kernel: str,
    backend: str,
    device: str,
    shapes: Mapping[str, Any],
    params: Mapping[str, Any],
    time_ms: float,
) -> None:
    """Add one correct measurement to the performance records."""
    store.execute(
        "INSERT INTO perf_records (run_id, problem, kernel, backend, device, shapes, params, time_ms, created)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id,
            problem,
            kernel,
            backend,
            device,
            json.dumps(dict(shapes)),
            json.dumps(dict(params)),
            time_ms,
            datetime.now(timezone.utc).isoformat(timespec="seconds"),
        ),
    )


def perf_rows(store: Store) -> list[sqlite3.Row]:
    """Every performance record of an open store (``shapes`` and ``params`` as stored JSON)."""
    return store.query(_PERF)


def perf_rows_of_file(path: Path) -> list[sqlite3.Row]:
    """Every performance record of a store file, read-only (another run's store is never written);
    none when it predates the table. A file that is not a store raises :class:`sqlite3.Error`."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    with contextlib.closing(conn):
        if not conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='perf_records'"
        ).fetchall():
            return []
        return list(conn.execute(_PERF).fetchall())
