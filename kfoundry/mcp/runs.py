"""Background optimisation runs: ``start_optimization`` and ``run_status``.

A run is a ``kf-run resume RUN_DIR`` child process in its own run folder under the runs root: the
server writes the folder (``run.json``, as ``kf-run PROBLEM`` would) and returns at once; the child
runs the loop, crash-isolated, and keeps going if the server exits. ``run_status`` reads the folder:
the store (``kfoundry.db``) for progress and the best kernel so far, ``mcp.json`` for the process and
``mcp.log`` (the child's output) for the reason of a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kfoundry.core.commands.optimize import budget_total
from kfoundry.core.config import RunConfig, load_config
from kfoundry.core.errors import ConfigError, KfError, ProblemError
from kfoundry.core.generator import GeneratorUnsupported, ProblemSummary, refuse_unsupported
from kfoundry.core.loop import (
    RUN_FILE,
    STORE_FILE,
    find_seed_kernel,
    new_run_dir,
    read_run_file,
    run_shape_sets,
    write_run_file,
)
from kfoundry.core.models import Candidate, EvalRecord
from kfoundry.core.plugins import get_plugin
from kfoundry.core.store import Store
from kfoundry.mcp.models import RunStatusArgs, StartOptimizationArgs
from kfoundry.mcp.settings import ServerSettings, backend_language

if TYPE_CHECKING:
    from kfoundry.core.problem import Problem

PROCESS_FILE = "mcp.json"
LOG_FILE = "mcp.log"
#: How the child is started: ``kf-run resume RUN_DIR`` with this very interpreter.
_CHILD = "from kfoundry.core.cli import main; main()"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class RunError(KfError):
    """An unknown run id, a run folder that cannot be read, or a candidate not in the run."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_folder(settings: ServerSettings, run_id: str) -> Path:
    """The folder of ``run_id`` under the runs root, or :class:`RunError`."""
    folder = settings.runs_root / run_id
    if not _RUN_ID.match(run_id) or not (folder / RUN_FILE).is_file():
        raise RunError(
            f"unknown run id {run_id!r} (no run folder with {RUN_FILE} under {settings.runs_root})"
        )
    return folder


def open_store(folder: Path) -> Store | None:
    """The run's store, or None while the child has not created it yet."""
    path = folder / STORE_FILE
    return Store(path) if path.is_file() else None


def has_table(store: Store, name: str) -> bool:
    return bool(store.query("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)))


def rank(record: EvalRecord, multi_shape: bool) -> float:
    """Sort key of a correct kernel, best first: the time, or in a multi-shape run the geo-mean speedup."""
    if multi_shape:
        return -(record.speedup or 0.0)
    return record.timing.median_ms if record.timing else float("inf")


def run_kernels(store: Store, run_id: str, multi_shape: bool = False) -> dict[str, EvalRecord]:
    """Each correct kernel of a run with its best evaluation (search and tuning alike).

    A multi-shape run's per-shape evaluations are not comparable: there each proposal's aggregated
    record (correct on every shape set, geo-mean speedup) stands for the kernel.
    """
    if multi_shape and has_table(store, "loop_proposals"):
        sql = "SELECT candidate_hash, record FROM loop_proposals WHERE run_id=? AND record IS NOT NULL"
    else:
        sql = "SELECT candidate_hash, record FROM evaluations WHERE run_id=? AND outcome='correct'"
    best: dict[str, EvalRecord] = {}
    for row in store.query(sql + " ORDER BY rowid", (run_id,)):
        record = EvalRecord.model_validate_json(row["record"])
        if not record.is_correct or record.timing is None:
            continue
        held = best.get(row["candidate_hash"])
        if held is None or rank(record, multi_shape) < rank(held, multi_shape):
            best[row["candidate_hash"]] = record
    return best


def best_record(
    store: Store, run_id: str, multi_shape: bool = False
) -> tuple[Candidate | None, EvalRecord] | None:
    """The best correct kernel of a run so far, with its record (None while there is none)."""
    kernels = run_kernels(store, run_id, multi_shape)
    if not kernels:
        return None
    h = min(kernels, key=lambda k: rank(kernels[k], multi_shape))
    return store.get_candidate(h), kernels[h]


def kernel_summary(candidate: Candidate | None, record: EvalRecord) -> dict[str, Any]:
    """A kernel in one line of data: id, label, verdict and times."""
    return {
        "candidate_id": record.candidate_hash,
        "label": candidate.label if candidate else "",
        "language": candidate.language if candidate else None,
        "params": candidate.params if candidate else {},
        "generator": candidate.generator if candidate else None,
        "outcome": record.outcome.value,
        "median_ms": record.timing.median_ms if record.timing else None,
        "iqr_ms": record.timing.iqr_ms if record.timing else None,
        "reference_ms": record.reference_timing.median_ms if record.reference_timing else None,
        "speedup": record.speedup,
        "roofline_fraction": record.roofline_fraction,
        "roofline_flag": record.roofline_flag,
        "backend": record.backend,
        "device": record.device,
    }


def _last_error(log: Path) -> str | None:
    """The child's ``error: ...`` line (or its last line), for a failed run."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines)[-1] if lines else None


def _has_error(log: Path) -> bool:
    return (_last_error(log) or "").startswith("error:")


def _pid_runs(pid: int, folder: Path) -> bool:
    """Whether ``pid`` is alive and is this run's child (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and str(folder).encode() in cmdline


def _end_group(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the process group a child leads (it was started in a session of its own), SIGKILL after."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            os.killpg(pid, 0)  # ProcessLookupError once every member is gone
            time.sleep(0.05)
        os.killpg(pid, signal.SIGKILL)


def refuse_unsupported_problem(config: RunConfig, problem: Problem, language: str) -> None:
    """A config error when every configured generator's ``check`` refuses the (KernelBench) problem."""
    if problem.format != "kernelbench":
        return
    try:
        generators = [get_plugin("llm", c.name).build(c.options) for c in config.llms]
    except KfError:
        return  # the run reports an unknown generator with its context
    summary = ProblemSummary(
        name=problem.name,
        reference_source=problem.source,
        shapes=dict(problem.shapes),
        path=str(problem.path),
    )
    try:
        refuse_unsupported(generators, summary, language)
    except GeneratorUnsupported as exc:
        raise ConfigError(str(exc)) from None


class RunManager:
    """Starts runs as child processes and reports on run folders (its own and any other)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    # -- start -------------------------------------------------------------------------------------

    def start(self, args: StartOptimizationArgs) -> dict[str, Any]:
        """Validate the run's inputs (config, problem, seed, the generators' support) as ``kf-run PROBLEM``
        does, write its folder and start its child."""
        from kfoundry.api import shape_sets_of
        from kfoundry.core.problem import load_problem

        config = self.settings.config(args.overrides, backend=args.backend, shapes=args.shapes)
        path = Path(args.problem).resolve()
        sets = shape_sets_of(config)
        shapes = sets[0]
        problem = load_problem(path, shapes)  # a malformed problem or an unknown shape fails here, at once
        language = backend_language(config)
        refuse_unsupported_problem(config, problem, language)
        seed = find_seed_kernel(path, language)
        if args.seed_kernel is not None:
            seed = Path(args.seed_kernel).resolve()
            if not seed.is_file():
                raise ProblemError(f"seed kernel not found: {args.seed_kernel}")
        run_id, folder = new_run_dir(config, problem.name)
        write_run_file(folder, run_id, path, shapes, config, seed, shape_sets=sets)
        with Store(folder / STORE_FILE) as store:  # as `kf-run PROBLEM` does before its loop starts
            store.save_run(run_id, problem.name, config.model_dump(mode="json"))
        argv = [sys.executable, "-c", _CHILD, "resume", str(folder)]
        with open(folder / LOG_FILE, "wb") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        process = {"pid": proc.pid, "argv": argv, "started_at": _now(), "returncode": None, "ended_at": None}
        (folder / PROCESS_FILE).write_text(json.dumps(process, indent=2))
        with self._lock:
            self._procs[run_id] = proc
        threading.Thread(target=self._watch, args=(run_id, folder, proc), daemon=True).start()
        return {
            "run_id": run_id,
            "run_dir": str(folder),
            "status": "running",
            "pid": proc.pid,
            "problem": problem.name,
            "shapes": shapes,
            "shape_sets": sets,
            "planned_evaluations": budget_total(config),
        }

    def _watch(self, run_id: str, folder: Path, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        path = folder / PROCESS_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            data = {"pid": proc.pid}
        data.update(returncode=code, ended_at=_now())
        path.write_text(json.dumps(data, indent=2))

    def stop(self, args: RunStatusArgs) -> dict[str, Any]:
        """Stop a running run's child (its whole process group: judges and runners too); resumable."""
        folder = run_folder(self.settings, args.run_id)
        process = self._process(args.run_id, folder)
        if process is None:
            raise RunError(f"run {args.run_id!r} was not started by kf-run mcp: stop its kf-run yourself")
        if process["alive"]:
            path = folder / PROCESS_FILE
            data = json.loads(path.read_text())
            data["stopped_at"] = _now()
            path.write_text(json.dumps(data, indent=2))
            _end_group(int(process["pid"]))
        return self.status(args)

    # -- status ------------------------------------------------------------------------------------

    def _process(self, run_id: str, folder: Path) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((folder / PROCESS_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            return None  # a run folder this server did not start
        with self._lock:
            proc = self._procs.get(run_id)
        if proc is not None:
            code = proc.poll()
            data["alive"] = code is None
            data["returncode"] = code
        else:
            data["alive"] = data.get("returncode") is None and _pid_runs(int(data.get("pid", 0)), folder)
        return data

    def status(self, args: RunStatusArgs) -> dict[str, Any]:
        """Progress of a run (generation, evaluations, best kernel so far) and whether it is still going."""
        folder = run_folder(self.settings, args.run_id)
        info = read_run_file(folder)
        config = load_config(data=info["config"], validate_plugins=False)
        process = self._process(args.run_id, folder)
        out: dict[str, Any] = {
            "run_id": args.run_id,
            "run_dir": str(folder),
            "problem": Path(info["problem"]).stem,
            "shapes": info.get("shapes") or {},
            "shape_sets": run_shape_sets(info),
            "generation": 0,
            "generations": config.budget.generations,
            "evaluations": 0,
            "planned_evaluations": budget_total(config),
            "correct": 0,
            "best": None,
            "stop_reason": "",
            "summary": None,
            "process": process,
        }
        stored_status = ""
        store = open_store(folder)
        if store is not None:
            try:
                stored_status = self._read_store(store, info["run_id"], len(out["shape_sets"]) > 1, out)
            finally:
                store.close()
        if stored_status == "finished":
            status = "finished"
        elif process is None:
            status = stored_status or "starting"  # a folder run by another kf-run: the store says
        elif process["alive"]:
            status = "running"
        elif process.get("stopped_at"):
            status = "stopped"  # by stop_optimization: `kf-run resume RUN_DIR` continues it
        elif process.get("returncode") not in (None, 0) or (
            process.get("returncode") is None and _has_error(folder / LOG_FILE)
        ):  # (a child that ended after its server did left no return code, only its error line)
            status = "failed"
            out["error"] = _last_error(folder / LOG_FILE)
        else:
            status = "stopped"  # killed from outside: `kf-run resume RUN_DIR` continues it
        out["status"] = status
        return out

    def _read_store(self, store: Store, run_id: str, multi_shape: bool, out: dict[str, Any]) -> str:
        """Fill in progress and the best kernel from the run's store; returns the stored run status."""
        run = store.get_run(run_id)
        state: dict[str, Any] = {}
        if has_table(store, "loop_state"):
            rows = store.query("SELECT data FROM loop_state WHERE run_id=?", (run_id,))
            state = json.loads(rows[0]["data"]) if rows else {}
        out["generation"] = state.get("generation", 0)
        out["stop_reason"] = state.get("stop_reason", "")
        out["elapsed_s"] = round(float(state.get("elapsed_s", 0.0)), 3)
        if has_table(store, "loop_proposals"):  # counted as the loop counts its budget
            row = store.query(
                """SELECT COUNT(*) AS n, SUM(json_extract(record, '$.outcome') = 'correct') AS ok
                   FROM loop_proposals WHERE run_id=? AND record IS NOT NULL AND candidate IS NOT NULL""",
                (run_id,),
            )[0]
            out["evaluations"] = int(row["n"]) + int(state.get("tuning_evaluations", 0))
            out["correct"] = int(row["ok"] or 0)
        best = best_record(store, run_id, multi_shape)
        out["best"] = kernel_summary(*best) if best else None
        if run is None:
            return ""
        if run["status"] == "finished":
            out["summary"] = run["summary"]
        return str(run["status"])
