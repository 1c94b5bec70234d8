"""The kernel database over the run folders' stores: ``search_kernels`` and ``get_kernel``."""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

from kfoundry.core.errors import KfError
from kfoundry.core.loop import RUN_FILE, STORE_FILE, read_run_file, run_shape_sets
from kfoundry.mcp.models import GetKernelArgs, SearchKernelsArgs
from kfoundry.mcp.runs import RunError, best_record, kernel_summary, open_store, run_folder, run_kernels
from kfoundry.mcp.settings import ServerSettings

log = logging.getLogger(__name__)


def _families() -> tuple[str, ...]:
    try:
        from kfoundry.plugins.llms.offline.recognize import FAMILIES
    except ImportError:  # pragma: no cover - the offline generator ships with kfoundry
        return ()
    return tuple(FAMILIES)


@lru_cache(maxsize=256)
def _family_of(problem_path: str, shapes_json: str, mtime: float) -> str | None:
    """The operation family the offline generator recognises in a problem (None: none, or native)."""
    try:
        from kfoundry.core.problem import load_problem
        from kfoundry.plugins.llms.offline.recognize import recognize

        problem = load_problem(problem_path, json.loads(shapes_json))
        if problem.format != "kernelbench":
            return None
        return recognize(problem.summary()).family
    except Exception as exc:  # an unrecognised or unreadable problem has no family
        log.debug("no operation family for %s: %s", problem_path, exc)
        return None


def _run_family(info: dict[str, Any]) -> str | None:
    path = Path(info["problem"])
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    return _family_of(str(path), json.dumps(info.get("shapes") or {}, sort_keys=True), mtime)


def _problem_name(text: str) -> str:
    path = Path(text)
    return path.stem if path.suffix in (".py", ".toml") else text


def search_kernels(settings: ServerSettings, args: SearchKernelsArgs) -> dict[str, Any]:
    """Correct kernels in every run folder under the runs root that match, fastest first."""
    if args.op_family is not None and args.op_family not in (known := _families()):
        raise KfError(f"op_family: unknown family {args.op_family!r} (known: {', '.join(known)})")
    name = _problem_name(args.problem) if args.problem else None
    hits: list[dict[str, Any]] = []
    runs = 0
    for db in sorted(settings.runs_root.glob(f"*/{STORE_FILE}")):
        folder = db.parent
        if not (folder / RUN_FILE).is_file():
            continue
        info = read_run_file(folder)
        family = _run_family(info) if args.op_family is not None else None
        if args.op_family is not None and family != args.op_family:
            continue
        store = open_store(folder)
        if store is None:
            continue
        try:
            multi = len(run_shape_sets(info)) > 1
            kernels = {
                h: r
                for h, r in run_kernels(store, info["run_id"], multi).items()
                if (name is None or r.problem == name)
                and (args.backend is None or r.backend == args.backend)
                and (args.device is None or args.device.lower() in r.device.lower())
            }
            for h, record in kernels.items():
                hit = kernel_summary(store.get_candidate(h), record)
                hit.update(run_id=info["run_id"], problem=record.problem, shape_sets=run_shape_sets(info))
                if family is not None:
                    hit["op_family"] = family
                hits.append(hit)
            runs += 1 if kernels else 0
        finally:
            store.close()
    hits.sort(key=lambda h: (h["median_ms"], h["run_id"]))  # across runs: by time (shapes may differ)
    return {
        "kernels": hits[: args.limit],
        "total": len(hits),
        "runs": runs,
        "runs_root": str(settings.runs_root),
    }


def get_kernel(settings: ServerSettings, args: GetKernelArgs) -> dict[str, Any]:
    """A kernel's source and candidate record, with its best evaluation (and how many it had)."""
    folder = run_folder(settings, args.run_id)
    info = read_run_file(folder)
    run_id = info["run_id"]
    store = open_store(folder)
    if store is None:
        raise RunError(f"run {args.run_id!r} has no store yet")
    try:
        rows = store.query(
            "SELECT hash FROM candidates WHERE run_id=? AND hash LIKE ? ORDER BY rowid",
            (run_id, args.candidate_id + "%"),
        )
        if not rows:
            raise RunError(f"no candidate {args.candidate_id!r} in run {args.run_id!r}")
        if len(rows) > 1:
            raise RunError(
                f"candidate id {args.candidate_id!r} is ambiguous in run {args.run_id!r}: give more of it"
            )
        h = rows[0]["hash"]
        candidate = store.get_candidate(h)
        assert candidate is not None
        records = store.evaluations(run_id=run_id, candidate_hash=h)
        multi = len(run_shape_sets(info)) > 1
        record = run_kernels(store, run_id, multi).get(h) or (records[-1] if records else None)
        best = best_record(store, run_id, multi)
        return {
            "run_id": args.run_id,
            "candidate_id": h,
            "source": candidate.source,
            "candidate": candidate.model_dump(mode="json"),
            "record": json.loads(record.model_dump_json()) if record else None,
            "evaluations": len(records),
            "best_of_run": best is not None and best[1].candidate_hash == h,
        }
    finally:
        store.close()
