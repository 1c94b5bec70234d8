"""The sandbox: each job runs in a fresh child process with a wall-clock timeout and a memory limit.

Children are forked by a per-process fork server (:mod:`.zygote`) that has already imported torch
and pyopencl, so a child starts fast, inherits no device context and no state from earlier jobs.
The child's stdout/stderr go to a file whose tail joins the job's log. A hang is killed at the
timeout (``timeout``); a crash (segfault, abort, out of memory) is a ``runtime_error`` naming the
signal; either way the next job gets a fresh child. Thread-safe: executors may call
:func:`run_sandboxed` from several threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kfoundry.core.evaluation.jobs import EvalJob, JobResult, describe_exit
from kfoundry.core.models import Outcome

LOG_TAIL = 4000
START_TIMEOUT_S = 120.0
#: The judge ends a job at its timeout itself; this is how much longer the sandbox waits before killing it.
JUDGE_GRACE_S = 15.0
#: the most time a job's wait for its device's lane may add to the sandbox's limit
MAX_LANE_WAIT_S = 3600.0


class _Waiter:
    def __init__(self) -> None:
        self.pid: int | None = None
        self.status: int | None = None
        self.started = threading.Event()
        self.ended = threading.Event()


def _server_environment() -> dict[str, str]:
    """The fork server's environment: the runners' allow-list plus HOME and Python's own variables.

    Runners are forks of the server, so a key the server never had cannot be left in their memory.
    """
    from kfoundry.core.evaluation.confine import DEFAULT_ENV_ALLOW, env_allowed

    allow = (*DEFAULT_ENV_ALLOW, "HOME", "USER", "TMPDIR", "PYTHON*", "VIRTUAL_ENV", "KF_*", "TRITON_*")
    return {k: v for k, v in os.environ.items() if env_allowed(k, allow)}


class ForkServer:
    """Client of one zygote process (started lazily, restarted if it dies)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._waiters: dict[int, _Waiter] = {}
        self._next = 0

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._fail_all()
            env = _server_environment()
            # Spinning OpenMP threads make torch's reference collapse on a busy or small machine.
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            # The children import what this process can import (kfoundry from a checkout, plugins...).
            env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kfoundry.core.evaluation.zygote"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
            )
            threading.Thread(target=self._read, args=(self._proc,), daemon=True).start()
        return self._proc

    def _fail_all(self) -> None:
        for waiter in self._waiters.values():
            waiter.started.set()
            waiter.ended.set()
        self._waiters.clear()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            with self._lock:
                waiter = self._waiters.get(message.get("id"))
            if waiter is None:
                continue
            if "pid" in message:
                waiter.pid = message["pid"]
                waiter.started.set()
            if "status" in message:
                waiter.status = message["status"]
                waiter.ended.set()
        with self._lock:
            if self._proc is proc:
                self._fail_all()

    def submit(self, request: dict[str, Any]) -> _Waiter:
        waiter = _Waiter()
        with self._lock:
            proc = self._ensure()
            self._next += 1
            request["id"] = self._next
            self._waiters[self._next] = waiter
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(request) + "\n").encode())
            proc.stdin.flush()
        return waiter

    def forget(self, waiter: _Waiter) -> None:
        with self._lock:
            for key, value in list(self._waiters.items()):
                if value is waiter:
                    del self._waiters[key]

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                try:
                    self._proc.wait(10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
            self._proc = None
            self._fail_all()


_server = ForkServer()


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - LOG_TAIL))
            return handle.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _kill(pid: int | None) -> None:
    if pid is None:
        return
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
            return
        except OSError:
            continue


def _kill_runner(pid_file: str) -> None:
    """Kill the job's runner (PID 1 of its namespace: the kernel ends everything in it) if it outlived its judge."""
    try:
        pid = int(Path(pid_file).read_text().strip() or 0)
    except (OSError, ValueError):
        return
    if pid > 1:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _waited_s(path: str) -> float:
    """Seconds the job has reported waiting for its device's lane, counting a wait still going on
    (``<seconds waited before> <monotonic start of the current wait, or ->``; 0 when none is told)."""
    try:
        before, since = Path(path).read_text().split()
        now = time.monotonic()
        return max(0.0, float(before)) + (max(0.0, now - float(since)) if since != "-" else 0.0)
    except (OSError, ValueError):
        return 0.0


def _wait_for_job(waiter: _Waiter, allowed_s: float, waited_path: str) -> bool:
    """Wait until the job ends (True) or has run ``allowed_s`` plus the time it reported waiting for
    the device's lane (False). The wait is the worker's word, but the worker is the trusted judge (the
    candidate runs in a separate runner that cannot reach this file); it is capped all the same."""
    begun = time.monotonic()
    while True:
        limit = begun + allowed_s + min(_waited_s(waited_path), MAX_LANE_WAIT_S)
        left = limit - time.monotonic()
        if left <= 0:
            return waiter.ended.is_set()
        if waiter.ended.wait(min(left, 1.0)):
            return True


def run_sandboxed(job: EvalJob) -> JobResult:
    """Run ``job`` in a fresh child process; every failure comes back as a :class:`JobResult`."""
    workdir = tempfile.mkdtemp(prefix="kf-job-")
    log_path, result_path = os.path.join(workdir, "log"), os.path.join(workdir, "result.json")
    Path(log_path).touch()
    timeout = job.evaluation.timeout_s
    # The CUDA driver reserves far more virtual address space than it uses (unified addressing):
    # an address-space limit makes context creation fail, so GPU jobs (any backend) run without one.
    memory_mb = None if job.on_gpu or job.backend == "cuda" else job.evaluation.memory_limit_mb
    waiter = _server.submit(
        {"job": job.model_dump_json(), "log": log_path, "result": result_path, "memory_mb": memory_mb}
    )
    try:
        waiter.started.wait(START_TIMEOUT_S)
        begun = time.monotonic()
        finished = _wait_for_job(waiter, timeout + JUDGE_GRACE_S, result_path + ".waited")
        elapsed = time.monotonic() - begun
        if not finished:
            _kill(waiter.pid)
            waiter.ended.wait(10)
            result = JobResult(outcome=Outcome.timeout, message=f"timed out after {timeout:g} s (killed)")
        elif os.path.exists(result_path):
            result = JobResult.model_validate_json(Path(result_path).read_text())
        else:
            result = JobResult(
                outcome=Outcome.runtime_error,
                message=f"worker crashed: {describe_exit(waiter.status, 'the sandbox server died', ' without a result')}",
            )
        output = _tail(log_path)
        if output:
            result.log = (result.log + "\n--- worker output ---\n" + output).strip()
        result.wall_s = result.wall_s or elapsed
        return result
    finally:
        _server.forget(waiter)
        if not waiter.ended.is_set():
            _kill(waiter.pid)
        _kill_runner(result_path + ".runner")
        for path in (
            log_path,
            result_path,
            result_path + ".tmp",
            result_path + ".runner",
            result_path + ".waited",
            result_path + ".waited.tmp",
        ):
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(workdir)


def shutdown() -> None:
    """Stop the fork server (it also stops by itself when this process exits)."""
    _server.close()
