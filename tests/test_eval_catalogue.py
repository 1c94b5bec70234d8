"""The cheat catalogue: every candidate under tests/data/{bad,escape,honest}/ whose docstring's first line
is machine-readable gets the verdict it names, and escape attempts leave no trace outside their job.

First docstring line: ``problem=<name> [shape k=v ...] expect=<outcome>[|<outcome>...] [max_speedup=<x>]
[hint=<text to the end of the line>]``; the second line describes the trick. ``expect=any`` accepts any
verdict. ``max_speedup``: if the verdict is ``correct``, the measured speedup over the reference may not
exceed it (a cheat on the clock or on the timing phase that a sound evaluator turns back into an honest,
slow candidate). Shapes default to ``eval_helpers.SMALL_SHAPES``.

Escape candidates (``tests/data/escape/``) compute the right answer for vector_add after trying to escape;
their verdict may be ``correct`` or ``rejected``, but: the TCP listener on 127.0.0.1:47391 receives
nothing, no ``kf-escape-marker`` file appears outside the job (``/tmp``, the repository, ``$HOME``), no
process whose command line holds the marker survives, and the canary secrets (``OPENAI_API_KEY`` in the
environment the fork server inherits, a canary file in the real home directory) appear in no record.
"""

from __future__ import annotations

import ast
import contextlib
import glob
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from eval_helpers import EXAMPLES, ROOT, SMALL_SHAPES, fast_config

from kfoundry.core.evaluation import Evaluator, sandbox
from kfoundry.core.models import Candidate, EvalRecord, Outcome
from kfoundry.core.problem import load_problem

DATA = Path(__file__).resolve().parent / "data"
KINDS = ("bad", "escape", "honest")
MARKER = "kf-escape-marker"
LISTEN_PORT = 47391
ANY = "any"


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    path: Path
    problem: str
    shapes: tuple[tuple[str, int], ...]
    expect: frozenset[str]
    hint: str | None
    max_speedup: float | None
    description: str

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"


def parse(kind: str, path: Path) -> Entry | None:
    """The entry a candidate's docstring describes (None: no machine-readable first line)."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc or not doc.startswith("problem="):
        return None
    first, _, rest = doc.partition("\n")
    head, _, hint = first.partition(" hint=")
    fields: dict[str, str] = {}
    shapes: dict[str, int] = {}
    in_shape = False
    for token in head.split():
        if token == "shape":
            in_shape = True
            continue
        key, sep, value = token.partition("=")
        assert sep, f"{path}: malformed token {token!r}"
        if key in ("problem", "expect", "max_speedup"):
            fields[key] = value
            in_shape = False
        elif in_shape:
            shapes[key] = int(value)
        else:
            raise AssertionError(f"{path}: unknown key {key!r}")
    problem = fields["problem"]
    merged = dict(SMALL_SHAPES.get(problem, {}))
    merged.update(shapes)
    expect = frozenset(fields["expect"].split("|"))
    known = {o.value for o in Outcome} | {ANY}
    assert expect <= known, f"{path}: unknown outcome in {fields['expect']}"
    return Entry(
        kind=kind,
        name=path.stem,
        path=path,
        problem=problem,
        shapes=tuple(sorted(merged.items())),
        expect=expect,
        hint=hint.strip() or None,
        max_speedup=float(fields["max_speedup"]) if "max_speedup" in fields else None,
        description=rest.strip().splitlines()[0] if rest.strip() else "",
    )


def _catalogue() -> list[Entry]:
    entries = []
    for kind in KINDS:
        for path in sorted((DATA / kind).glob("*.py")):
            entry = parse(kind, path)
            if entry is not None:
                entries.append(entry)
    return entries


CATALOGUE = _catalogue()
BY_ID = {e.id: e for e in CATALOGUE}


class _Listener:
    """A TCP listener on 127.0.0.1:LISTEN_PORT counting connections and bytes (content never kept)."""

    def __init__(self) -> None:
        self.connections = 0
        self.bytes = 0
        self.bound = False
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind(("127.0.0.1", LISTEN_PORT))
            self._sock.listen(16)
            self._sock.settimeout(0.2)
            self.bound = True
        except OSError:
            self._sock.close()
            return
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.settimeout(1.0)
            with contextlib.suppress(OSError):
                while chunk := conn.recv(65536):
                    self.bytes += len(chunk)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.close()


def _marker_paths() -> list[str]:
    home = os.path.expanduser("~")
    found: list[str] = []
    for base in ("/tmp", str(ROOT), home, str(ROOT / "tests"), str(ROOT / "tests" / "data")):
        found += glob.glob(os.path.join(base, MARKER + "*")) + glob.glob(
            os.path.join(base, "." + MARKER + "*")
        )
    return sorted(set(found))


def _marker_processes() -> list[int]:
    """Live processes whose command line holds the marker (never this test process)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if MARKER.encode() in cmdline:
            pids.append(int(entry))
    return pids


def _remove(paths: list[str]) -> None:
    import shutil

    for p in paths:
        with contextlib.suppress(OSError):
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)


@dataclass
class Run:
    records: dict[str, EvalRecord] = field(default_factory=dict)
    canaries: list[str] = field(default_factory=list)
    listener_bound: bool = False
    connections: int = 0
    received: int = 0
    markers: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    seconds: float = 0.0
    #: entry id -> median ms of its problem's honest seed, measured in the same batch
    controls: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    token = secrets.token_hex(8)
    env_canary = f"sk-kf-canary-{token}"
    file_canary = f"kf-canary-file-{token}"
    canary_file = Path(os.path.expanduser("~")) / f".kf-canary-{token}"
    saved_env = os.environ.get("OPENAI_API_KEY")
    _remove(_marker_paths())
    result = Run(canaries=[env_canary, file_canary])
    # The fork server inherits os.environ when it starts: stop any running one so the next job starts
    # one that holds the canary (it is started lazily by the first job).
    sandbox.shutdown()
    os.environ["OPENAI_API_KEY"] = env_canary
    canary_file.write_text(file_canary + "\n")
    listener = _Listener()
    result.listener_bound = listener.bound
    start = time.monotonic()
    try:
        groups: dict[tuple[str, tuple[tuple[str, int], ...]], list[Entry]] = {}
        for entry in CATALOGUE:
            groups.setdefault((entry.problem, entry.shapes), []).append(entry)
        for (problem_name, shapes), entries in groups.items():
            problem = load_problem(EXAMPLES / "kernelbench" / f"{problem_name}.py", dict(shapes))
            # many trials (rare errors); no entry is expected to time out, so the limit only has to be
            # generous enough for a loaded 2-core machine (each job's compiles run in a confined child)
            config = fast_config(cache=False, timeout_s=90.0, correctness_budget_s=1.0)
            config.executor.options = {"workers": 2}
            # the problem's honest seed, timed in the same batch: what "no speed gained" is measured against
            control = EXAMPLES / "kernelbench" / "seeds" / f"{problem_name}_opencl.py"
            controls = [Candidate(source=control.read_text(), label="control")] if control.is_file() else []
            with Evaluator(problem, config) as evaluator:
                records = evaluator.evaluate_many(
                    [Candidate(source=e.path.read_text(), label=e.id) for e in entries] + controls
                )
            result.records.update({e.id: r for e, r in zip(entries, records[: len(entries)], strict=True)})
            if controls and records[-1].timing is not None:
                for e in entries:
                    result.controls[e.id] = records[-1].timing.median_ms
        time.sleep(1.0)  # daemons that outlive their job get a moment to act
        result.seconds = time.monotonic() - start
        result.connections, result.received = listener.connections, listener.bytes
        result.markers = _marker_paths()
        result.processes = _marker_processes()
        yield result
    finally:
        listener.close()
        for pid in _marker_processes():  # only processes the escape candidates started
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _remove(_marker_paths() + glob.glob("/tmp/kf-bad-cache-*"))
        with contextlib.suppress(OSError):
            canary_file.unlink()
        if saved_env is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = saved_env
        sandbox.shutdown()


def test_catalogue_is_complete() -> None:
    counts = {kind: sum(e.kind == kind for e in CATALOGUE) for kind in KINDS}
    assert counts["bad"] >= 40 and counts["escape"] >= 8 and counts["honest"] >= 15, counts
    for entry in CATALOGUE:
        assert entry.description, f"{entry.id}: the docstring's second line describes the trick"
        if entry.kind == "honest":
            assert entry.expect == {"correct"}, entry.id
        if entry.kind == "escape":
            assert entry.expect == {ANY} and entry.problem == "vector_add", entry.id


@pytest.mark.parametrize("entry_id", [e.id for e in CATALOGUE if e.kind == "bad"])
def test_bad_candidate_is_caught(run: Run, entry_id: str) -> None:
    entry, record = BY_ID[entry_id], run.records[entry_id]
    if ANY not in entry.expect:
        assert record.outcome.value in entry.expect, (
            f"{entry_id} ({entry.description}): {record.outcome.value}: {record.message[:300]}"
        )
    if entry.hint:
        assert entry.hint in record.message, f"{entry_id}: {record.message[:300]}"
    if entry.max_speedup is not None and record.outcome is Outcome.correct:
        # over the reference, or over the honest seed timed side by side when that is closer (the
        # reference's own speed drifts on a loaded machine): a cheat that gained speed beats both
        assert record.timing is not None and record.speedup is not None
        honest = run.controls.get(entry_id)
        gained = min(record.speedup, honest / record.timing.median_ms) if honest else record.speedup
        assert gained <= entry.max_speedup, (
            f"{entry_id} ({entry.description}): judged correct at {record.speedup:.3g}x over the reference "
            f"and {gained:.3g}x the honest seed's speed (at most {entry.max_speedup:g}x expected)"
        )


@pytest.mark.parametrize("entry_id", [e.id for e in CATALOGUE if e.kind == "honest"])
def test_honest_candidate_is_correct(run: Run, entry_id: str) -> None:
    record = run.records[entry_id]
    assert record.outcome is Outcome.correct, f"{entry_id}: {record.outcome.value}: {record.message[:300]}"


@pytest.mark.parametrize("entry_id", [e.id for e in CATALOGUE if e.kind == "escape"])
def test_escape_candidate_verdict(run: Run, entry_id: str) -> None:
    record = run.records[entry_id]
    # the verdict is not the point (containment is, below); the run must go on and give one
    assert record.outcome is not Outcome.timeout, (
        f"{entry_id}: {record.outcome.value}: {record.message[:300]}"
    )


@pytest.mark.parametrize("entry_id", [e.id for e in CATALOGUE])
def test_no_secret_in_record(run: Run, entry_id: str) -> None:
    record = run.records[entry_id]
    for canary in run.canaries:
        kind = "environment" if canary.startswith("sk-") else "home-directory file"
        # the log itself is not printed: it may hold whatever else the candidate found
        assert canary not in record.log, f"{entry_id}: the {kind} canary is in the record's log"
        assert canary not in record.message, f"{entry_id}: the {kind} canary is in the record's message"


def test_nothing_reached_the_network(run: Run) -> None:
    assert run.listener_bound, f"could not bind 127.0.0.1:{LISTEN_PORT} (in use?)"
    assert run.connections == 0 and run.received == 0, (
        f"the listener on 127.0.0.1:{LISTEN_PORT} got {run.connections} connections, {run.received} bytes"
    )


def test_no_marker_file_outside_the_job(run: Run) -> None:
    assert not run.markers, f"files written outside the job's scratch directory: {run.markers}"


def test_no_process_outlived_its_job(run: Run) -> None:
    assert not run.processes, (
        f"processes still running with {MARKER!r} in their command line: {run.processes}"
    )
