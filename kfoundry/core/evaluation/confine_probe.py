"""The confinement probe: a runner confined for real, made to try what each protection forbids."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfoundry.core.evaluation.confine import _cap_eff, confine
from kfoundry.core.evaluation.confine_plan import PROTECTIONS, ConfinementPlan, Protection
from kfoundry.core.evaluation.libc import new_pid_namespace
from kfoundry.core.evaluation.process_tree import (
    _pid_ns,
)

_PROBE_SECRET = "KF_PROBE_SECRET_TOKEN"


@dataclass
class _Canaries:
    port: int  # a TCP server listening on 127.0.0.1 outside
    host_file: str  # a file in the host's temp dir
    home_file: str | None  # a file in the real home dir


def _probe_runner(plan: ConfinementPlan, canaries: _Canaries) -> list[list[Any]]:
    """Run in the confined process: try what each protection must forbid."""
    start = time.perf_counter()
    report = confine(plan)
    cost_ms = (time.perf_counter() - start) * 1000

    def pid_namespace() -> str:
        visible = [n for n in os.listdir("/proc") if n.isdigit()]
        assert os.getpid() == 1 and len(visible) == 1, f"pid {os.getpid()}, {len(visible)} processes visible"
        return "PID 1 of its own namespace, alone in it; the namespace ends with it"

    def network() -> str:
        try:
            socket.create_connection(("127.0.0.1", canaries.port), timeout=0.5).close()
        except OSError as exc:
            return f"127.0.0.1:{canaries.port} (listening outside) unreachable: {exc.strerror or exc}"
        raise AssertionError(f"connected to 127.0.0.1:{canaries.port} outside")

    def filesystem() -> str:
        for path in (canaries.host_file, canaries.home_file):
            assert path is None or not os.path.exists(path), f"{path} is visible"
        for where in ("/", "/usr", "/etc", sys.prefix):
            with contextlib.suppress(OSError):
                Path(where, ".kf-probe").write_text("x")
                raise AssertionError(f"wrote into {where}")
        return f"new root, read-only but {report.scratch}; home and host temp files hidden ({cost_ms:.0f} ms to confine)"

    def environment() -> str:
        assert _PROBE_SECRET not in os.environ, f"{_PROBE_SECRET} is visible"
        return f"{len(os.environ)} variables passed, secrets withheld"

    def unprivileged() -> str:
        assert os.getuid() != 0 and _cap_eff() == 0, f"uid {os.getuid()}, CapEff {_cap_eff()}"
        return f"uid {os.getuid()}, no capabilities"

    def no_new_privs() -> str:
        assert "NoNewPrivs:\t1" in Path("/proc/self/status").read_text(), "NoNewPrivs is 0"
        return "PR_SET_NO_NEW_PRIVS=1"

    def limits() -> str:
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert nproc == (plan.max_processes,) * 2 and nofile == (plan.max_open_files,) * 2, (
            f"{nproc} {nofile}"
        )
        return f"NPROC {nproc[0]}, NOFILE {nofile[0]}, FSIZE {plan.max_file_mb} MB, CORE 0"

    def scratch_cap() -> str:
        path = Path(report.scratch, "tmp", "fill")
        try:
            with path.open("wb") as out:
                for _ in range(plan.scratch_mb + 2):
                    out.write(b"\0" * 2**20)
        except OSError as exc:
            return f"{plan.scratch_mb} MB tmpfs, then {exc.strerror}"
        finally:
            path.unlink(missing_ok=True)
        raise AssertionError(f"wrote {plan.scratch_mb + 2} MB into a {plan.scratch_mb} MB scratch")

    tests: dict[str, Callable[[], str]] = {
        "pid_namespace": pid_namespace,
        "network": network,
        "filesystem": filesystem,
        "environment": environment,
        "unprivileged": unprivileged,
        "no_new_privs": no_new_privs,
        "limits": limits,
        "scratch_cap": scratch_cap,
    }
    out: list[list[Any]] = []
    for name in PROTECTIONS:
        try:
            ok, detail = True, tests[name]()
        except Exception as exc:
            ok, detail = False, str(exc) or type(exc).__name__
        if not report.in_force[name]:
            ok, detail = False, "; ".join(n for n in report.notes if n.startswith(name + ":")) or detail
        out.append([name, ok, detail])
    return out


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _probe_judge(write_fd: int) -> None:
    """The judge's part: canaries, a new PID namespace, the confined runner; results to ``write_fd``."""
    os.environ[_PROBE_SECRET] = "canary"
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    made: list[str] = []
    with contextlib.suppress(OSError):
        made.append(tempfile.mkstemp(prefix="kf-probe-")[1])
    with contextlib.suppress(OSError):
        made.append(tempfile.mkstemp(prefix=".kf-probe-", dir=Path.home())[1])
    canaries = _Canaries(
        server.getsockname()[1], made[0] if made else "/nonexistent", made[1] if len(made) > 1 else None
    )
    in_ns = new_pid_namespace()
    read_fd, runner_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            results = _probe_runner(ConfinementPlan(scratch_mb=8, keep_fds=(runner_fd,)), canaries)
            os.write(runner_fd, json.dumps(results).encode())
        finally:
            os._exit(0)
    os.close(runner_fd)
    server.close()
    ns = _pid_ns(pid)
    results = json.loads(_read_all(read_fd) or b"[]")
    os.waitpid(pid, 0)
    for path in made:
        os.unlink(path)
    left = [p for p in os.listdir("/proc") if p.isdigit() and _pid_ns(p) == ns]
    for entry in results:
        if entry[0] == "pid_namespace" and entry[1] and (left or not in_ns):
            entry[1:] = [False, f"{len(left)} process(es) outlived the runner"]
    os.write(write_fd, json.dumps(results).encode())


def probe() -> list[Protection]:
    """Fork a child, confine it, and test each protection for real."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            _probe_judge(write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    raw = _read_all(read_fd)
    os.waitpid(pid, 0)
    found = {name: (ok, detail) for name, ok, detail in json.loads(raw or b"[]")}
    return [Protection(n, *found.get(n, (False, "the probe died before testing it"))) for n in PROTECTIONS]
