"""A run folder read back for people: its run file, store rows and best kernel, as typed objects.

Read-only: the store is opened with SQLite's ``mode=ro`` so a report or a listing never changes a
run (a running one included). Tables another component adds (LLM calls, tuner trials) may be absent.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfoundry.core.errors import KfError
from kfoundry.core.models import Candidate, EvalRecord, TuningResult

RUN_FILE = "run.json"
STORE_FILE = "kfoundry.db"
REPORT_FILE = "report.html"


class RunFolderError(KfError):
    """A folder that is not a (readable) kfoundry run."""


@dataclass
class Evaluation:
    """One evaluated proposal of the loop, in evaluation order."""

    order: int
    generation: int
    idx: int
    generator: str
    mode: str
    candidate: Candidate | None
    record: EvalRecord
    evaluated_at: str | None

    @property
    def label(self) -> str:
        return self.candidate.label if self.candidate else "(no code)"


@dataclass
class TuningStage:
    """One tuning of an elite: its result and the trials in order (time in ms, None when invalid)."""

    generation: int
    candidate_hash: str
    result: TuningResult
    trials: list[tuple[int, float | None]] = field(default_factory=list)
    #: The shape set this stage tuned on (a multi-shape run tunes each set; empty: all of them).
    shapes: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunData:
    """Everything a report, ``runs``, ``show`` and ``export`` read from one run folder."""

    run_dir: Path
    run_id: str
    problem: str
    problem_path: str
    status: str
    created_at: str
    config: dict[str, Any]
    summary: dict[str, Any]
    shape_sets: list[dict[str, Any]]
    evaluations: list[Evaluation]
    archive: list[dict[str, Any]]
    tuning: list[TuningStage]
    llm_calls: list[dict[str, Any]]
    candidates: dict[str, Candidate]
    records: dict[str, list[EvalRecord]]
    best: tuple[Candidate, EvalRecord] | None
    seed: Evaluation | None

    @property
    def language(self) -> str:
        if self.best:
            return self.best[0].language
        return next((e.candidate.language for e in self.evaluations if e.candidate), "opencl")

    def correct(self) -> list[tuple[Candidate, EvalRecord]]:
        """Every distinct correct kernel of the run (tuned ones included), fastest first."""
        out: dict[str, tuple[Candidate, EvalRecord]] = {}
        for e in self.evaluations:
            if e.candidate is not None and e.record.is_correct:
                out.setdefault(e.candidate.content_hash, (e.candidate, e.record))
        for h, recs in self.records.items():
            cand = self.candidates.get(h)
            if cand is None or h in out or len(self.shape_sets) > 1:
                continue  # a multi-shape run's aggregate verdicts live in the loop's rows only
            good = [r for r in recs if r.is_correct]
            if good:
                out[h] = (cand, good[-1])
        if self.best is not None and self.best[1].is_correct:
            out.setdefault(self.best[0].content_hash, self.best)
        return sorted(out.values(), key=lambda cr: -(cr[1].speedup or 0.0))

    def find_candidate(self, prefix: str) -> Candidate:
        """The candidate whose hash starts with ``prefix`` (one line if none or several match)."""
        hits = [h for h in self.candidates if h.startswith(prefix)] if prefix else []
        if len(hits) != 1:
            near = ", ".join(sorted(self.candidates)[:5])
            what = "no candidate" if not hits else f"{len(hits)} candidates"
            raise RunFolderError(f"{self.run_dir}: {what} with id {prefix!r} (ids look like: {near})")
        return self.candidates[hits[0]]

    def lineage(self, candidate: Candidate) -> list[Candidate]:
        """``candidate`` and its ancestors, the oldest first (as far as the store knows them)."""
        chain, seen = [candidate], {candidate.content_hash}
        while (
            chain[-1].parent_id and chain[-1].parent_id in self.candidates and chain[-1].parent_id not in seen
        ):
            parent = self.candidates[chain[-1].parent_id]
            seen.add(parent.content_hash)
            chain.append(parent)
        return chain[::-1]

    def best_record_of(self, content_hash: str) -> EvalRecord | None:
        """The loop's verdict of a candidate (aggregate over shape sets), else the store's last one."""
        for e in self.evaluations:
            if e.candidate is not None and e.candidate.content_hash == content_hash:
                return e.record
        if self.best and self.best[0].content_hash == content_hash:
            return self.best[1]
        recs = self.records.get(content_hash)
        return recs[-1] if recs else None


def _connect(path: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    except sqlite3.Error as exc:
        raise RunFolderError(f"cannot open {path}: {exc}") from None
    conn.row_factory = sqlite3.Row
    return conn


def _rows(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise RunFolderError(f"unreadable store: {exc}") from None


def read_run_info(run_dir: Path) -> dict[str, Any]:
    """The run file of a run folder (one line when it is missing or broken)."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        raise RunFolderError(f"{run_dir}: not a kfoundry run folder (no {RUN_FILE})")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunFolderError(f"{path}: unreadable run file: {exc}") from None
    if not isinstance(data, dict) or "run_id" not in data:
        raise RunFolderError(f"{path}: not a kfoundry run file (no run_id)")
    return data


def load_run(run_dir: str | Path) -> RunData:
    """Read a run folder (see :class:`RunData`)."""
    folder = Path(run_dir)
    info = read_run_info(folder)
    run_id = str(info["run_id"])
    db = folder / STORE_FILE
    if not db.is_file():
        raise RunFolderError(f"{folder}: no {STORE_FILE} (the run never started?)")
    conn = _connect(db)
    try:
        return _load(folder, info, run_id, conn)
    except sqlite3.DatabaseError as exc:
        raise RunFolderError(f"{db}: {exc}") from None
    finally:
        conn.close()


def _load(folder: Path, info: dict[str, Any], run_id: str, conn: sqlite3.Connection) -> RunData:
    run = _rows(conn, "SELECT * FROM runs WHERE id=?", (run_id,))
    state = _rows(conn, "SELECT data FROM loop_state WHERE run_id=?", (run_id,))
    status = run[0]["status"] if run else "unknown"
    if state and status != "finished":
        status = json.loads(state[0]["data"]).get("status", status)
    evaluations: list[Evaluation] = []
    rows = _rows(
        conn,
        "SELECT * FROM loop_proposals WHERE run_id=? AND record IS NOT NULL "
        "ORDER BY evaluated_at, generation, idx",
        (run_id,),
    )
    for i, r in enumerate(rows):
        ask = json.loads(r["ask"])
        evaluations.append(
            Evaluation(
                order=i,
                generation=r["generation"],
                idx=r["idx"],
                generator=r["generator"],
                mode=ask.get("mode", ""),
                candidate=Candidate.model_validate_json(r["candidate"]) if r["candidate"] else None,
                record=EvalRecord.model_validate_json(r["record"]),
                evaluated_at=r["evaluated_at"],
            )
        )
    candidates = {
        r["hash"]: Candidate.model_validate_json(r["data"])
        for r in _rows(conn, "SELECT hash, data FROM candidates")
    }
    for e in evaluations:
        if e.candidate is not None:
            candidates.setdefault(e.candidate.content_hash, e.candidate)
    records: dict[str, list[EvalRecord]] = {}
    for r in _rows(
        conn, "SELECT candidate_hash, record FROM evaluations WHERE run_id=? ORDER BY id", (run_id,)
    ):
        records.setdefault(r["candidate_hash"], []).append(EvalRecord.model_validate_json(r["record"]))
    tuning = []
    for r in _rows(
        conn,
        "SELECT generation, candidate_hash, result FROM loop_tuning WHERE run_id=? ORDER BY id",
        (run_id,),
    ):
        result = TuningResult.model_validate_json(r["result"])
        tuning.append(
            TuningStage(
                generation=r["generation"],
                candidate_hash=r["candidate_hash"],
                result=result,
                trials=[(i, t.get("time_ms")) for i, t in enumerate(result.trials)],
                shapes=dict(json.loads(r["result"]).get("shapes") or {}),
            )
        )
    calls = [
        dict(r)
        for r in _rows(
            conn,
            "SELECT member, kind, tokens_in, tokens_out, cost_usd, generation, "
            "error_kind FROM llm_calls WHERE run_id=? OR run_id IS NULL ORDER BY seq",
            (run_id,),
        )
    ]
    best = None
    best_file = folder / "best.json"
    if best_file.is_file():
        try:
            data = json.loads(best_file.read_text())
            best = (Candidate.model_validate(data["candidate"]), EvalRecord.model_validate(data["record"]))
        except (OSError, json.JSONDecodeError, KeyError, ValueError) as exc:
            raise RunFolderError(f"{best_file}: unreadable: {exc}") from None
    seed = next((e for e in evaluations if e.candidate is not None and e.candidate.meta.get("seed")), None)
    if best is None:  # no best.json: a budget stopped generation 0; its fastest correct evaluation
        done = [e for e in evaluations if e.candidate is not None and e.record.is_correct]
        fastest = max(done, key=lambda e: e.record.speedup or 0.0, default=None)
        if fastest is not None and fastest.candidate is not None:
            best = (fastest.candidate, fastest.record)
    sets = info.get("shape_sets") or [info.get("shapes") or {}]
    return RunData(
        run_dir=folder,
        run_id=run_id,
        problem=run[0]["problem"] if run else Path(info["problem"]).stem,
        problem_path=str(info.get("problem", "")),
        status=status,
        created_at=run[0]["created_at"] if run else "",
        config=info.get("config") or {},
        summary=json.loads(run[0]["summary"]) if run else {},
        shape_sets=[dict(s) for s in sets],
        evaluations=evaluations,
        archive=[
            dict(r) | {"coords": json.loads(r["coords"])}
            for r in _rows(conn, "SELECT * FROM archive_cells WHERE run_id=?", (run_id,))
        ],
        tuning=tuning,
        llm_calls=calls,
        candidates=candidates,
        records=records,
        best=best,
        seed=seed,
    )


@dataclass
class ShapeBest:
    """The fastest correct kernel on one shape set, with that set's verdict."""

    shapes: dict[str, Any]
    candidate: Candidate
    speedup: float | None
    median_ms: float | None
    reference_ms: float | None


def per_shape_results(record: EvalRecord, shape_sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A record's per-shape verdicts (a single-shape run: the record itself, on its one set)."""
    rows = record.resources.get("per_shape")
    if rows:
        return [dict(r) for r in rows]
    return [
        {
            "shapes": dict(shape_sets[0]) if shape_sets else {},
            "outcome": record.outcome.value,
            "speedup": record.speedup,
            "median_ms": record.timing.median_ms if record.timing else None,
            "reference_ms": record.reference_timing.median_ms if record.reference_timing else None,
            "eval_key": record.eval_key,
        }
    ]


def best_per_shape(run: RunData) -> list[ShapeBest]:
    """For every shape set of the run, the correct kernel that was fastest on it."""
    out: list[ShapeBest] = []
    kernels = run.correct()
    for i, shapes in enumerate(run.shape_sets):
        best: ShapeBest | None = None
        for cand, rec in kernels:
            rows = per_shape_results(rec, run.shape_sets)
            if i >= len(rows) or rows[i].get("outcome") != "correct" or rows[i].get("median_ms") is None:
                continue
            r = rows[i]
            if best is None or r["median_ms"] < (best.median_ms or float("inf")):
                best = ShapeBest(
                    shapes=dict(shapes),
                    candidate=cand,
                    speedup=r.get("speedup"),
                    median_ms=r["median_ms"],
                    reference_ms=r.get("reference_ms"),
                )
        if best is not None:
            out.append(best)
    return out


def run_overview(run_dir: Path) -> dict[str, Any]:
    """One line of ``kf-run runs``: status, problem, best, when (cheap: no rows are decoded)."""
    info = read_run_info(run_dir)
    run_id = str(info["run_id"])
    out: dict[str, Any] = {
        "run_dir": str(run_dir),
        "run_id": run_id,
        "problem": Path(str(info.get("problem", "?"))).stem,
        "status": "not started",
        "created_at": None,
        "evaluations": 0,
        "best_speedup": None,
        "best_label": None,
        "stop_reason": None,
    }
    db = run_dir / STORE_FILE
    if not db.is_file():
        return out
    conn = _connect(db)
    try:
        run = _rows(conn, "SELECT created_at, problem, status, summary FROM runs WHERE id=?", (run_id,))
        if run:
            summary = json.loads(run[0]["summary"] or "{}")
            out.update(
                problem=run[0]["problem"] or out["problem"],
                status=run[0]["status"],
                created_at=run[0]["created_at"],
                stop_reason=summary.get("stop_reason"),
            )
        state = _rows(conn, "SELECT data FROM loop_state WHERE run_id=?", (run_id,))
        if state and out["status"] != "finished":
            out["status"] = json.loads(state[0]["data"]).get("status", out["status"])
        n = _rows(
            conn, "SELECT COUNT(*) AS n FROM loop_proposals WHERE run_id=? AND record IS NOT NULL", (run_id,)
        )
        out["evaluations"] = int(n[0]["n"]) if n else 0
        best = _rows(
            conn,
            "SELECT label, speedup FROM archive_cells WHERE run_id=? AND outcome='correct' "
            "ORDER BY speedup DESC LIMIT 1",
            (run_id,),
        )
        if not best:  # no generation finished: the fastest correct evaluation so far
            best = _rows(
                conn,
                "SELECT json_extract(candidate, '$.label') AS label, json_extract(record, '$.speedup') "
                "AS speedup FROM loop_proposals WHERE run_id=? AND json_extract(record, '$.outcome')="
                "'correct' ORDER BY speedup DESC LIMIT 1",
                (run_id,),
            )
        if best:
            out.update(best_speedup=best[0]["speedup"], best_label=best[0]["label"])
    except (sqlite3.DatabaseError, json.JSONDecodeError) as exc:
        raise RunFolderError(f"{db}: {exc}") from None
    finally:
        conn.close()
    return out
