"""The optimize loop's tables: its state, every proposal with its verdict, the archive, tuning results.

``loop_state`` holds one JSON document per run (what ``kf-run resume`` continues from);
``loop_proposals`` one row per proposal, written before it is evaluated and completed with its verdict;
``archive_cells`` the archive as a table (for reports and queries; the loop state has the archive too);
``loop_tuning`` each tuning stage's result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from kfoundry.core.errors import StoreError
from kfoundry.core.models import ArchiveCell, Candidate, EvalRecord
from kfoundry.core.search import SearchAsk
from kfoundry.core.store import Store


@dataclass
class Row:
    """One stored proposal and (once evaluated) its verdict."""

    generation: int
    idx: int
    ask: SearchAsk
    candidate: Candidate | None
    generator: str
    rationale: str = ""
    parse_error: str | None = None
    coords: tuple[int, ...] | None = None
    record: EvalRecord | None = None


def load_state(store: Store, run_id: str) -> str | None:
    """The run's saved loop state (JSON), or None for a run that has not saved one."""
    rows = store.query("SELECT data FROM loop_state WHERE run_id=?", (run_id,))
    return str(rows[0]["data"]) if rows else None


def save_state(store: Store, run_id: str, data: str) -> None:
    """Replace the run's loop state."""
    store.execute(
        "INSERT INTO loop_state (run_id, data) VALUES (?, ?) ON CONFLICT(run_id) DO UPDATE SET data=excluded.data",
        (run_id, data),
    )


def proposals(store: Store, run_id: str, generation: int | None = None) -> list[Row]:
    """The run's stored proposals (of one generation if given), in generation and index order."""
    sql = "SELECT * FROM loop_proposals WHERE run_id=?"
    args: list[Any] = [run_id]
    if generation is not None:
        sql += " AND generation=?"
        args.append(generation)
    out = []
    for r in store.query(sql + " ORDER BY generation, idx", args):
        where = f"loop_proposals row (generation {r['generation']}, index {r['idx']}), column"
        out.append(
            Row(
                generation=r["generation"],
                idx=r["idx"],
                ask=store.decode(SearchAsk, r["ask"], f"{where} ask"),
                candidate=store.decode(Candidate, r["candidate"], f"{where} candidate")
                if r["candidate"]
                else None,
                generator=r["generator"],
                rationale=r["rationale"],
                parse_error=r["parse_error"],
                coords=_coords(store, r["coords"], f"{where} coords") if r["coords"] else None,
                record=store.decode(EvalRecord, r["record"], f"{where} record") if r["record"] else None,
            )
        )
    return out


def _coords(store: Store, text: str, where: str) -> tuple[int, ...]:
    coords = store.decode_json(text, where)
    if not isinstance(coords, list) or not all(isinstance(c, int) for c in coords):
        raise StoreError(f"store {store.path}: {where} is unreadable: not a list of cell indices")
    return tuple(coords)


def insert_proposals(store: Store, run_id: str, rows: Iterable[Row]) -> None:
    """Store a generation's proposals (one transaction), before any is evaluated."""
    store.executemany(
        """INSERT INTO loop_proposals (run_id, generation, idx, candidate, candidate_hash, ask, generator,
           rationale, parse_error, coords) VALUES (?,?,?,?,?,?,?,?,?,?)""",
        [
            (
                run_id,
                r.generation,
                r.idx,
                r.candidate.model_dump_json() if r.candidate else None,
                r.candidate.content_hash if r.candidate else None,
                r.ask.model_dump_json(),
                r.generator,
                r.rationale,
                r.parse_error,
                json.dumps(list(r.coords)) if r.coords else None,
            )
            for r in rows
        ],
    )


def save_verdict(store: Store, run_id: str, row: Row) -> None:
    """Complete a stored proposal with its evaluation record, and the cell it was placed in once
    evaluated (measured traffic may have moved it from the planned one): resume reads that cell."""
    assert row.record is not None
    store.execute(
        "UPDATE loop_proposals SET record=?, evaluated_at=?, coords=COALESCE(?, coords)"
        " WHERE run_id=? AND generation=? AND idx=?",
        (
            row.record.model_dump_json(),
            datetime.now(timezone.utc).isoformat(),
            json.dumps(list(row.coords)) if row.coords else None,
            run_id,
            row.generation,
            row.idx,
        ),
    )


def evaluated_count(store: Store, run_id: str) -> int:
    """Proposals with code that have a verdict (a parse error costs no evaluation)."""
    rows = store.query(
        "SELECT COUNT(*) AS n FROM loop_proposals WHERE run_id=? AND record IS NOT NULL AND candidate IS NOT NULL",
        (run_id,),
    )
    return int(rows[0]["n"])


def proposed_hashes(store: Store, run_id: str) -> set[str]:
    """Content hashes of every candidate proposed in the run so far."""
    rows = store.query(
        "SELECT candidate_hash FROM loop_proposals WHERE run_id=? AND candidate_hash IS NOT NULL", (run_id,)
    )
    return {str(r["candidate_hash"]) for r in rows}


def save_archive(store: Store, run_id: str, cells: Iterable[ArchiveCell]) -> None:
    """Write the archive's cells (one transaction; a cell's row is replaced by its new elite)."""
    store.executemany(
        """INSERT INTO archive_cells VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(run_id, island, coords) DO UPDATE
           SET candidate_hash=excluded.candidate_hash, label=excluded.label, outcome=excluded.outcome,
           speedup=excluded.speedup, median_ms=excluded.median_ms, fitness=excluded.fitness,
           migrated=excluded.migrated""",
        [
            (
                run_id,
                c.island,
                json.dumps(list(c.coords)),
                c.candidate.content_hash,
                c.candidate.label,
                c.record.outcome.value,
                c.record.speedup,
                c.record.timing.median_ms if c.record.timing else None,
                c.record.fitness,
                int(c.migrated),
            )
            for c in cells
        ],
    )


def save_tuning(
    store: Store, run_id: str, generation: int, candidate_hash: str, result: dict[str, Any]
) -> None:
    """Store one tuning result of the tuning stage after ``generation``."""
    store.execute(
        "INSERT INTO loop_tuning (run_id, generation, candidate_hash, result) VALUES (?,?,?,?)",
        (run_id, generation, candidate_hash, json.dumps(result)),
    )


def tuning_results(store: Store, run_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    """(generation, candidate hash, result) of every tuning of the run, in order."""
    rows = store.query(
        "SELECT generation, candidate_hash, result FROM loop_tuning WHERE run_id=? ORDER BY id", (run_id,)
    )
    return [
        (int(r[0]), str(r[1]), store.decode_json(r[2], f"loop_tuning row of run {run_id!r}")) for r in rows
    ]
