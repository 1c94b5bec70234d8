"""Warm starts for the tuner from a performance database.

Every tuning trial that gives a time is also written to the store's ``perf_records`` table with what
it was measured on: the kernel (its template source), the problem, the device and the shapes in
force. When a kernel is tuned, the records of the same kernel (or, failing that, the same problem
and parameter names) become the first configurations tried:

- from the evaluator's own store: the shapes already tuned in this run, or earlier ``kf-run tune``
  calls sharing ``output_dir``;
- from ``tuner.warm_start``: run folders, ``kfoundry.db``/``.sqlite`` stores, Kernel Tuner cache
  files (``kf-run tune --record``, Kernel Tuner itself), or directories holding any of these (a
  performance-database directory, such as a runs folder copied from another machine).

Each earlier context (origin, device, shapes) is weighted by its distance to the one tuned now
(another device, and every doubling of a shape, cost distance); a configuration's score is the best,
over contexts, of weight times its speed relative to that context's best. The ``tuner.warm_seeds``
best scores are seeded (evaluated first, told to the tuner), after the candidate's own values.
``benchmarks/warm_start.py`` measures what this saves.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfoundry.core.db import tuning as tuning_db
from kfoundry.core.errors import ConfigError, KfError
from kfoundry.core.models import Candidate, ParamValue, stable_hash
from kfoundry.core.space import Config, ParamSpace

log = logging.getLogger(__name__)

#: Distance of a record measured on another device, of a different kernel of the same problem, and
#: of one doubling (or halving) of a shape, averaged over the shapes both contexts name.
DEVICE_DISTANCE, KERNEL_DISTANCE, SHAPE_DISTANCE = 1.0, 2.0, 0.5
#: Files a perf-database directory scan looks at (how deep, and how many at most).
SCAN_DEPTH, SCAN_LIMIT = 3, 2000


class WarmStartError(ConfigError):
    """A warm-start source is missing or unreadable."""


@dataclass(frozen=True)
class Context:
    """What a configuration was (or is to be) measured on."""

    kernel: str
    problem: str
    device: str
    shapes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PerfRecord:
    """One correct, timed configuration from the performance database."""

    context: Context
    params: Config
    time_ms: float
    origin: str


def kernel_key(candidate: Candidate) -> str:
    """The kernel template's identity: its source, language and kind (not its parameter values)."""
    return stable_hash(candidate.source, candidate.language, candidate.kind)


def context_of(evaluator: Any, candidate: Candidate) -> Context:
    """The context ``evaluator`` measures ``candidate`` in."""
    problem = getattr(evaluator, "problem", None)
    return Context(
        kernel=kernel_key(candidate),
        problem=str(getattr(problem, "name", "")),
        device=str(getattr(evaluator.device, "name", "")),
        shapes=dict(getattr(problem, "shapes", None) or {}),
    )


# -- writing -----------------------------------------------------------------------------------


def remember(
    store: Any, run_id: str | None, context: Context, backend: str, config: Config, time_ms: float
) -> None:
    """Add one correct measurement to ``store``'s performance records."""
    tuning_db.insert_perf_record(
        store, run_id, problem=context.problem, kernel=context.kernel, backend=backend, device=context.device,
        shapes=context.shapes, params=config, time_ms=time_ms,
    )  # fmt: skip


def remember_trial(evaluator: Any, candidate: Candidate, config: Config, time_ms: float | None) -> None:
    """The tuning stage's hook: record a correct trial in the evaluator's store (if it has one)."""
    store = getattr(evaluator, "store", None)
    if store is None or time_ms is None or not math.isfinite(time_ms):
        return
    backend = str(getattr(evaluator.device, "backend", ""))
    remember(
        store, getattr(evaluator, "run_id", None), context_of(evaluator, candidate), backend, config, time_ms
    )


# -- reading -----------------------------------------------------------------------------------


def _rows_to_records(rows: Iterable[Any], origin: str) -> list[PerfRecord]:
    out = []
    for row in rows:
        try:
            shapes, params = json.loads(row["shapes"] or "{}"), json.loads(row["params"])
        except (TypeError, ValueError):
            continue  # a damaged row is not worth failing a tuning over
        if isinstance(params, dict) and isinstance(shapes, dict) and row["time_ms"] is not None:
            context = Context(row["kernel"] or "", row["problem"] or "", row["device"] or "", shapes)
            out.append(PerfRecord(context, params, float(row["time_ms"]), origin))
    return out


def store_records(store: Any, origin: str = "this run") -> list[PerfRecord]:
    """Every performance record in an open :class:`~kfoundry.core.store.Store`."""
    return _rows_to_records(tuning_db.perf_rows(store), origin)


def _read_store_file(path: Path) -> list[PerfRecord]:
    """Records of a store file, read-only (another run's database is never written)."""
    try:
        rows = tuning_db.perf_rows_of_file(path)
    except sqlite3.Error as exc:
        raise WarmStartError(f"tuner.warm_start: {path}: not a readable kfoundry store ({exc})") from None
    return _rows_to_records(rows, str(path))


def _read_cache_file(path: Path, strict: bool) -> list[PerfRecord]:
    """Records of a Kernel Tuner cache file; its shapes are ``problem_size`` by position."""
    from kfoundry.core.recorded import RecordedSpace, RecordError

    try:
        recorded = RecordedSpace.load(path)
    except RecordError as exc:
        if strict:
            raise WarmStartError(f"tuner.warm_start: {exc}") from None
        return []
    size = recorded.problem_size
    shapes = {str(i): v for i, v in enumerate(size)} if isinstance(size, list) else {}
    context = Context("", recorded.kernel_name, recorded.device_name, shapes)
    return [
        PerfRecord(context, dict(zip(recorded.keys_order, key, strict=True)), abs(value), str(path))
        for key, value in recorded.values.items()
        if value is not None
    ]


def _scan(root: Path) -> list[Path]:
    found: list[Path] = []
    for depth in range(SCAN_DEPTH + 1):
        for p in sorted(root.glob("/".join(["*"] * (depth + 1)))):
            if p.is_file() and (
                p.suffix in (".db", ".sqlite") or (p.suffix == ".json" and p.name != "run.json")
            ):
                found.append(p)
            if len(found) >= SCAN_LIMIT:
                return found
    return found


_cache: dict[tuple[str, float, int, bool], list[PerfRecord]] = {}


def load_sources(paths: Sequence[str | Path]) -> list[PerfRecord]:
    """Records of every warm-start source; a missing or unreadable source named directly is an error.

    A directory is a run folder (its ``kfoundry.db``) or a performance-database directory: every store
    and Kernel Tuner cache file up to three levels down (other JSON files are skipped).
    """
    out: list[PerfRecord] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise WarmStartError(f"tuner.warm_start: {path}: no such file or directory")
        files = [(path, True)] if path.is_file() else [(p, False) for p in _scan(path)]
        for file, strict in files:
            stat = file.stat()
            key = (str(file.resolve()), stat.st_mtime, stat.st_size, strict)
            if key not in _cache:
                if file.suffix == ".json":
                    _cache[key] = _read_cache_file(file, strict)
                elif file.suffix in (".db", ".sqlite"):
                    _cache[key] = _read_store_file(file)
                else:
                    raise WarmStartError(
                        f"tuner.warm_start: {file}: expected a run folder, a store or a .json cache"
                    )
            out += _cache[key]
    return out


# -- ranking -----------------------------------------------------------------------------------


def _same_device(a: str, b: str) -> bool:
    a, b = a.strip().lower(), b.strip().lower()
    return bool(a) and (a == b or a.endswith(b) or b.endswith(a))


def _shape_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Mean |log2| ratio over the shapes both name; positional shapes (Kernel Tuner's) by order."""
    if not set(a) & set(b):
        a, b = ({str(i): v for i, v in enumerate(m.values())} for m in (a, b))
    ratios = [
        abs(math.log2(float(a[k]) / float(b[k])))
        for k in set(a) & set(b)
        if isinstance(a[k], int | float) and isinstance(b[k], int | float) and a[k] > 0 and b[k] > 0
    ]
    return sum(ratios) / len(ratios) if ratios else 2.0


def distance(source: Context, target: Context) -> float:
    """How far an earlier context is from the one tuned now (0: the same kernel, device and shapes)."""
    d = 0.0 if _same_device(source.device, target.device) else DEVICE_DISTANCE
    if source.kernel and target.kernel and source.kernel != target.kernel:
        d += KERNEL_DISTANCE
    return d + SHAPE_DISTANCE * _shape_distance(source.shapes, target.shapes)


def relevant(record: PerfRecord, space: ParamSpace, target: Context) -> bool:
    """A record of the same kernel, or of the same problem (or an unnamed one) with the space's names."""
    if not all(n in record.params for n in space.names):
        return False
    if record.context.kernel and target.kernel:
        return record.context.kernel == target.kernel or record.context.problem == target.problem
    return True


def rank_seeds(records: Iterable[PerfRecord], space: ParamSpace, target: Context, k: int) -> list[Config]:
    """The ``k`` configurations, valid in ``space``, that did best in the contexts nearest ``target``."""
    groups: dict[tuple[str, str, str, str], list[PerfRecord]] = {}
    for r in records:
        if relevant(r, space, target) and r.time_ms > 0:
            c = r.context
            groups.setdefault(
                (r.origin, c.kernel, c.device, json.dumps(dict(c.shapes), sort_keys=True)), []
            ).append(r)
    score: dict[tuple[ParamValue, ...], float] = {}
    for group in groups.values():
        weight = math.exp(-distance(group[0].context, target))
        best = min(r.time_ms for r in group)
        for r in group:
            config = {n: r.params[n] for n in space.names}
            if space.is_valid(config):
                key = space.key(config)
                score[key] = max(score.get(key, 0.0), weight * best / r.time_ms)
    ranked = sorted(score, key=lambda key: -score[key])
    return [space.config(key) for key in ranked[:k]]


def warm_seeds(evaluator: Any, candidate: Candidate, space: ParamSpace, tuner_config: Any) -> list[Config]:
    """The tuning stage's hook: seeds from the evaluator's store and ``tuner_config.warm_start``."""
    k = int(getattr(tuner_config, "warm_seeds", 0) or 0)
    if k <= 0:
        return []
    records = load_sources(list(getattr(tuner_config, "warm_start", None) or []))
    store = getattr(evaluator, "store", None)
    if store is not None:
        try:
            records += store_records(store)
        except KfError as exc:  # the run's own store failing is reported where it is written
            log.debug("warm start: own store not read: %s", exc)
    if not records:
        return []
    target = context_of(evaluator, candidate)
    seeds = rank_seeds(records, space, target, k)
    if seeds:
        origins = len({r.origin for r in records})
        log.info(
            "warm start %s on %s: %d seeds from %d records (%d sources)",
            candidate.label or target.problem,
            dict(target.shapes),
            len(seeds),
            len(records),
            origins,
        )
    return seeds
