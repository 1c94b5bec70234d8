"""The language-model tables: every call (``llm_calls``), the ensemble's votes (``llm_votes``) and the
prompt variants meta-prompting evolves (``prompts``)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kfoundry.core.store import Store

if TYPE_CHECKING:
    from kfoundry.core.llm.recording import CallRecord

#: The columns of a call a resumed run needs to continue its numbering, counts and budget.
_PREVIOUS = (
    "member, provider, model, kind, request_key, occurrence, prompt_hash, seq, tokens_in, tokens_out, "
    "cost_usd, error_kind"
)


def insert_call(store: Store, call: CallRecord) -> None:
    """Append one call (its prices and token cap go to the ``data`` column)."""
    store.execute(
        """INSERT INTO llm_calls (run_id, seq, member, provider, model, kind, request_key, occurrence,
           prompt_hash, system, prompt, response, tokens_in, tokens_out, cost_usd, latency_s, attempts,
           error, error_kind, generation, created_at, data)
           VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
        (
            call.run_id,
            call.seq,
            call.member,
            call.provider,
            call.model,
            call.kind,
            call.request_key,
            call.occurrence,
            call.prompt_hash,
            call.system,
            call.prompt,
            call.response,
            call.tokens_in,
            call.tokens_out,
            call.cost_usd,
            call.latency_s,
            call.attempts,
            call.error,
            call.error_kind,
            call.generation,
            call.created_at,
            json.dumps(
                {"max_tokens": call.max_tokens, "price_in": call.price_in, "price_out": call.price_out}
            ),
        ),
    )


def previous_calls(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run's calls so far, in sequence order, without prompts and replies."""
    rows = store.query(f"SELECT {_PREVIOUS} FROM llm_calls WHERE run_id=? ORDER BY seq", (run_id,))
    return [dict(r) for r in rows]


def read_calls(path: Path) -> list[dict[str, Any]]:
    """Every call of a store file, read-only, in insertion order (``data``'s fields merged in)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    with contextlib.closing(conn):
        rows = conn.execute("SELECT * FROM llm_calls ORDER BY id").fetchall()
    calls = []
    for row in rows:
        data = dict(row)
        extra = json.loads(data.pop("data") or "{}")
        data.pop("id", None)
        calls.append({**data, **extra})
    return calls


def insert_vote(
    store: Store,
    run_id: str | None,
    generation: int,
    proposals: list[Any],
    scores: dict[str, Any],
    points: list[float],
    kept: list[int],
) -> None:
    """Record one ensemble vote: who proposed what, each ranker's scores, the Borda points, who was kept."""
    store.execute(
        "INSERT INTO llm_votes (run_id, generation, proposals, scores, points, kept) VALUES (?,?,?,?,?,?)",
        (run_id, generation, json.dumps(proposals), json.dumps(scores), json.dumps(points), json.dumps(kept)),
    )


def prompt_variants(store: Store, run_id: str | None) -> list[dict[str, Any]]:
    """The run's prompt variants in creation order (``sections`` and ``outcomes`` decoded)."""
    out = []
    for r in store.query("SELECT * FROM prompts WHERE run_id=? ORDER BY rowid", (run_id,)):
        row = dict(r)
        where = f"prompts row {row['id']!r}"
        row["sections"] = store.decode_json(row["sections"], where + ", column sections")
        row["outcomes"] = store.decode_json(row["outcomes"], where + ", column outcomes")
        out.append(row)
    return out


def save_prompt_variant(
    store: Store,
    run_id: str | None,
    variant_id: str,
    *,
    parent_id: str | None,
    generation: int,
    section: str | None,
    sections: dict[str, str],
    uses: int,
    best_fitness: float | None,
    outcomes: dict[str, int],
) -> None:
    """Create a prompt variant or update its counts and fitness."""
    store.execute(
        """INSERT INTO prompts (id, run_id, parent_id, generation, section, sections, uses, best_fitness, outcomes)
           VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET uses=excluded.uses,
           best_fitness=excluded.best_fitness, outcomes=excluded.outcomes""",
        (
            variant_id,
            run_id,
            parent_id,
            generation,
            section,
            json.dumps(sections),
            uses,
            best_fitness,
            json.dumps(outcomes),
        ),
    )
