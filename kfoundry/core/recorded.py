"""Recorded spaces: Kernel Tuner cache files (read, write append-only), replay, and T4 export.

A Kernel Tuner cache file is a JSON object with ``device_name``, ``kernel_name``, ``problem_size``,
``tune_params_keys``, ``tune_params`` and ``cache``: a map from the parameter values joined by ","
to an entry holding each parameter, ``time`` (ms, or a failure name such as
``"CompilationFailedConfig"``), ``times`` and bookkeeping times. Files are written append-only (one
entry per line, closed at the end), so a killed recording can be read and resumed.

Replay ("simulation mode") answers a tuner from the file with no device. As in Kernel Tuner, the
replayed space is the set of recorded configurations that did not fail.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kfoundry.core.errors import KfError
from kfoundry.core.space import Config, ConfigKey, ParamSpace, SpaceError
from kfoundry.core.tuner import Invalidity, Measurement, Trial

FAILURES: dict[str, Invalidity] = {
    "CompilationFailedConfig": "compile",
    "RuntimeFailedConfig": "runtime",
    "InvalidConfig": "constraints",
    "ErrorConfig": "runtime",
}
_INVALIDITY_NAME: dict[str, str] = {
    "compile": "CompilationFailedConfig",
    "runtime": "RuntimeFailedConfig",
    "timeout": "RuntimeFailedConfig",
    "correctness": "RuntimeFailedConfig",
    "constraints": "InvalidConfig",
}
BOOKKEEPING = ("compile_time", "verification_time", "benchmark_time", "framework_time", "strategy_time")


class RecordError(KfError):
    """A recorded space (Kernel Tuner cache file) is missing or malformed."""


#: Larger cache files are refused before they are read (bounded memory).
MAX_CACHE_BYTES = 512 * 2**20
_JSON_ERRORS = (ValueError, RecursionError, MemoryError)  # JSONDecodeError, too many digits, deep nesting


def _read_json_tolerant(path: Path) -> dict[str, Any]:
    """Parse a cache file; one cut off mid-recording is closed first (as Kernel Tuner does)."""
    try:
        if not path.is_file():
            raise RecordError(f"recorded space not found: {path}")
        if path.stat().st_size > MAX_CACHE_BYTES:
            raise RecordError(f"{path}: larger than {MAX_CACHE_BYTES >> 20} MiB, not read")
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"cannot read recorded space {path}: {exc}") from None
    try:
        data = json.loads(text)  # a closed file: its keys in any order
    except _JSON_ERRORS as exc:
        first = exc
        try:  # cut off: the writer left "cache": { open, each entry ending in a comma
            data = json.loads(text.rstrip(",") + "}\n}")
        except _JSON_ERRORS:
            why = " ".join(str(first).split())[:200] or type(first).__name__
            raise RecordError(f"{path}: not a Kernel Tuner cache file: {why}") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: not a Kernel Tuner cache file (top level is not an object)")
    return data


def _finite(value: Any) -> bool:
    """A real number that fits a float and is finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def config_key_string(values: Sequence[Any]) -> str:
    """Kernel Tuner's cache key: the values joined by ","."""
    return ",".join(str(v) for v in values)


class RecordedSpace:
    """A recorded tuning space: every configuration's measured objective or failure."""

    def __init__(
        self,
        tune_params: Mapping[str, Sequence[Any]],
        entries: Mapping[ConfigKey, dict[str, Any]],
        *,
        device_name: str = "",
        kernel_name: str = "",
        problem_size: Any = None,
        objective: str = "time",
        higher_is_better: bool = False,
        name: str = "",
    ) -> None:
        self.tune_params = {k: list(v) for k, v in tune_params.items()}
        self.keys_order = list(self.tune_params)
        self.entries = dict(entries)
        self.device_name = device_name
        self.kernel_name = kernel_name
        self.problem_size = problem_size
        self.objective_name = objective
        self.higher_is_better = higher_is_better
        self.name = name or kernel_name or "recorded"
        self.values: dict[ConfigKey, float | None] = {k: self._value(e) for k, e in self.entries.items()}
        valid = [v for v in self.values.values() if v is not None]
        if not valid:
            raise RecordError(f"recorded space {self.name!r} has no valid configuration")
        #: The best objective in the space (lower is better; negated when higher is better).
        self.optimum = min(valid)

    @classmethod
    def load(
        cls, path: str | Path, objective: str | None = None, higher_is_better: bool = False
    ) -> RecordedSpace:
        """Read a Kernel Tuner cache file (closed or cut off mid-recording)."""
        p = Path(path)
        data = _read_json_tolerant(p)
        for field in ("tune_params_keys", "tune_params", "cache"):
            if field not in data:
                raise RecordError(f"{p}: not a Kernel Tuner cache file (no {field!r})")
        keys, table, cache = data["tune_params_keys"], data["tune_params"], data["cache"]
        if (
            not isinstance(keys, list)
            or not keys
            or not all(isinstance(k, str) and k.isidentifier() for k in keys)
        ):
            raise RecordError(f"{p}: tune_params_keys must be a non-empty list of parameter names")
        if len(set(keys)) != len(keys):
            raise RecordError(f"{p}: tune_params_keys names a parameter twice")
        if not isinstance(table, dict) or not isinstance(cache, dict):
            raise RecordError(f"{p}: tune_params and cache must be objects")
        params: dict[str, list[Any]] = {}
        for k in keys:
            values = table.get(k)
            if not isinstance(values, list) or not values or not all(_scalar(v) for v in values):
                raise RecordError(f"{p}: tune_params[{k!r}] must be a non-empty list of numbers or strings")
            params[k] = values
        obj = (
            objective or (data.get("objective") if isinstance(data.get("objective"), str) else None) or "time"
        )
        allowed = {k: {repr(v) for v in vs} for k, vs in params.items()}
        entries: dict[ConfigKey, dict[str, Any]] = {}
        for key_string, entry in cache.items():
            where = f"{p}: cache entry {key_string[:80]!r}"
            if not isinstance(entry, dict) or any(k not in entry for k in keys):
                raise RecordError(f"{where} lacks parameter values")
            bad = next((k for k in keys if repr(entry[k]) not in allowed[k]), None)
            if bad is not None:
                raise RecordError(
                    f"{where}: {bad}={str(entry[bad])[:40]!r} is not among tune_params[{bad!r}]"
                )
            entries[tuple(entry[k] for k in keys)] = entry
        recorded = cls(
            params,
            entries,
            device_name=str(data.get("device_name", ""))[:200],
            kernel_name=str(data.get("kernel_name", ""))[:200],
            problem_size=data.get("problem_size"),
            objective=obj,
            higher_is_better=higher_is_better,
            name=p.stem,
        )
        try:
            recorded.space()
        except SpaceError as exc:
            raise RecordError(f"{p}: {exc}") from None
        return recorded

    def _value(self, entry: Mapping[str, Any]) -> float | None:
        raw = entry.get(self.objective_name)
        if raw is None or not _finite(raw):  # a failure name, or a number no float holds
            return None
        return -float(raw) if self.higher_is_better else float(raw)

    # -- the replayed space ---------------------------------------------------------------------

    @property
    def valid_keys(self) -> list[ConfigKey]:
        return [k for k, v in self.values.items() if v is not None]

    def space(self) -> ParamSpace:
        """The replayed space: recorded configurations that did not fail (Kernel Tuner's definition)."""
        return ParamSpace(self.tune_params, members=self.valid_keys, block=())

    def measure(self, config: Mapping[str, Any]) -> Measurement:
        """Replay one configuration (no device)."""
        key = tuple(config[k] for k in self.keys_order)
        entry = self.entries.get(key)
        if entry is None:
            return Measurement(
                None, "constraints", f"configuration {config_key_string(key)} was not recorded"
            )
        value = self.values[key]
        if value is None:
            raw = entry.get(self.objective_name)
            return Measurement(None, FAILURES.get(str(raw), "runtime"), str(raw))
        times = entry.get("times")
        return Measurement(
            value,
            times=[float(t) for t in times if _finite(t)] if isinstance(times, list) else [],
            compile_time_ms=entry.get("compile_time"),
        )

    def fraction_within(self, ratio: float) -> float:
        """Share of valid configurations whose objective is within ``ratio`` of the optimum."""
        valid = [v for v in self.values.values() if v is not None]
        return sum(_within(v, self.optimum, ratio) for v in valid) / len(valid)

    def describe(self) -> str:
        n_valid = len(self.valid_keys)
        return (
            f"{self.name}: {self.kernel_name} on {self.device_name or '?'}, {len(self.keys_order)} parameters, "
            f"{len(self.entries)} recorded, {n_valid} valid, optimum {abs(self.optimum):.4g} {self.objective_name}"
        )


def _within(value: float, optimum: float, ratio: float) -> bool:
    """``value`` within ``ratio`` (e.g. 1.05) of ``optimum``, for minimised positive or negated objectives."""
    return value <= optimum * ratio if optimum >= 0 else value <= optimum / ratio


class CacheWriter:
    """Writes evaluations to a Kernel Tuner cache file, one line each; resumes an existing file."""

    def __init__(
        self,
        path: Path,
        *,
        device_name: str,
        kernel_name: str,
        problem_size: Any,
        tune_params: Mapping[str, Sequence[Any]],
        objective: str = "time",
    ) -> None:
        self.path = Path(path)
        self.keys_order = list(tune_params)
        self.done: set[str] = set()
        existing: dict[str, Any] = {}
        if self.path.is_file() and self.path.stat().st_size:
            data = _read_json_tolerant(self.path)
            if list(data.get("tune_params_keys", [])) != self.keys_order:
                raise RecordError(
                    f"{self.path}: recorded with other parameters {data.get('tune_params_keys')}"
                )
            existing = dict(data.get("cache", {}))
        header = {
            "device_name": device_name,
            "kernel_name": kernel_name,
            "problem_size": problem_size,
            "tune_params_keys": self.keys_order,
            "tune_params": {k: list(v) for k, v in tune_params.items()},
            "objective": objective,
            "cache": {},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w") as fh:
            fh.write(json.dumps(header, indent="")[:-3])  # leave "cache": { open
            for key, entry in existing.items():
                fh.write("\n" + json.dumps({key: entry})[1:-1] + ",")
        self.done = set(existing)

    def has(self, config: Mapping[str, Any]) -> bool:
        return config_key_string([config[k] for k in self.keys_order]) in self.done

    def add(self, config: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        """Append one entry: the parameter values plus ``time``/``times``/bookkeeping times."""
        key = config_key_string([config[k] for k in self.keys_order])
        if key in self.done:
            return
        entry = {k: config[k] for k in self.keys_order}
        entry.update(result)
        entry.setdefault("timestamp", datetime.now(timezone.utc).isoformat())
        with self.path.open("a") as fh:
            fh.write("\n" + json.dumps({key: entry})[1:-1] + ",")
        self.done.add(key)

    def add_measurement(self, config: Mapping[str, Any], m: Measurement) -> None:
        """Append a :class:`Measurement` in Kernel Tuner's vocabulary."""
        result: dict[str, Any] = {
            "time": m.value if m.valid else _INVALIDITY_NAME.get(m.invalidity, "RuntimeFailedConfig")
        }
        if m.valid:
            result["times"] = list(m.times)
        result["compile_time"] = m.compile_time_ms or 0.0
        for name in BOOKKEEPING[1:]:
            result.setdefault(name, 0.0)
        self.add(config, result)

    def close(self) -> None:
        """Close the JSON object (the file stays readable either way)."""
        text = self.path.read_text()
        if text.endswith(","):
            text = text[:-1]
        if not text.rstrip().endswith("}\n}"):
            self.path.write_text(text + "}\n}")


def t4_results(
    trials: Sequence[Trial], tune_params: Mapping[str, Sequence[Any]], objective: str = "time"
) -> dict[str, Any]:
    """Tuning results in the T4 auto-tuning output format (schema 1.0.0), as Kernel Tuner writes it."""
    results = []
    for trial in trials:
        m = trial.measurement
        measurements = [{"name": objective, "value": m.value, "unit": "ms"}] if m.valid else []
        results.append(
            {
                "timestamp": datetime.now(timezone.utc).isoformat(),
                "configuration": {k: trial.config[k] for k in tune_params},
                "times": {
                    "compilation": m.compile_time_ms or 0.0,
                    "benchmark": float(sum(m.times)),
                    "framework": 0.0,
                    "search_algorithm": 0.0,
                    "validation": 0.0,
                    "runtimes": list(m.times),
                },
                "invalidity": m.invalidity if m.valid or m.invalidity != "correct" else "runtime",
                "correctness": 1 if m.valid else 0,
                "measurements": measurements,
                "objectives": [objective],
            }
        )
    return {"results": results, "schema_version": "1.0.0", "metadata": {"timeunit": "milliseconds"}}


def export_t4(path: str | Path, trials: Sequence[Trial], tune_params: Mapping[str, Sequence[Any]]) -> Path:
    """Write :func:`t4_results` to ``path`` (JSON)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(t4_results(trials, tune_params), indent=1))
    return p


def replay_objective(recorded: RecordedSpace, delay_s: float = 0.0) -> Any:
    """An objective that answers from ``recorded`` (optionally sleeping to mimic a device)."""

    def objective(config: Config) -> Measurement:
        if delay_s:
            time.sleep(delay_s)
        return recorded.measure(config)

    return objective
