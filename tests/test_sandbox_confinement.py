"""The runner's OS-level confinement, proven on this machine's kernel: a child is forked, confined
(:func:`kfoundry.core.evaluation.confine.confine`) and made to try what each protection forbids."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import mmap
import os
import secrets
import socket
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any

import pytest

from kfoundry.core.evaluation.confine import (
    PROTECTIONS,
    ConfinementPlan,
    ConfinementReport,
    confine,
    env_allowed,
    freeze_tree,
    kill_tree,
    new_pid_namespace,
    thaw_tree,
    tree_members,
)
from kfoundry.core.evaluation.confine_probe import probe

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux namespaces")

REPO = Path(__file__).parents[1]
PLAN = ConfinementPlan(scratch_mb=16)


@dataclass
class Confined:
    """A judge-equivalent (in the test's namespaces) and its confined runner (PID 1 of a new one)."""

    judge: int
    runner: int
    conn: Connection
    report: ConfinementReport
    status: int | None = None

    def need(self, *names: str) -> None:
        """Skip, with the report's reasons, unless every protection in ``names`` is in force."""
        missing = [n for n in names if not self.report.in_force[n]]
        if missing:
            self.close()
            pytest.skip("; ".join(self.report.notes) or f"not in force: {missing}")

    def ask(self, message: Any = None) -> Any:
        self.conn.send(message)
        return self.answer()

    def answer(self) -> Any:
        reply = self.conn.recv()
        if isinstance(reply, dict) and "runner_error" in reply:
            raise AssertionError(reply["runner_error"])
        return reply

    def close(self) -> int:
        """End both processes; the judge's exit status."""
        if self.status is not None:
            return self.status
        self.status = self._end()
        return self.status

    def _end(self) -> int:
        with contextlib.suppress(OSError):
            self.conn.close()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.judge, os.WNOHANG)
            if pid:
                return status
            time.sleep(0.01)
        kill_tree(self.runner)
        return os.waitpid(self.judge, 0)[1]


def spawn(body: Callable[[Connection, ConfinementReport], Any], plan: ConfinementPlan = PLAN) -> Confined:
    """Fork a judge that forks a runner in a new PID namespace; the runner confines itself, runs ``body``."""
    ours, theirs = Pipe()
    pid_read, pid_write = os.pipe()
    judge = os.fork()
    if judge == 0:
        try:
            ours.close()
            os.close(pid_read)
            new_pid_namespace()
            runner = os.fork()
            if runner == 0:
                try:
                    report = confine(replace(plan, keep_fds=(theirs.fileno(),)))
                    theirs.send(report)
                    try:
                        theirs.send(body(theirs, report))
                    except Exception:
                        theirs.send({"runner_error": traceback.format_exc()})
                finally:
                    os._exit(0)
            os.write(pid_write, str(runner).encode())
            os.close(pid_write)
            theirs.close()
            os.waitpid(runner, 0)
        finally:
            os._exit(0)
    theirs.close()
    os.close(pid_write)
    runner = int(os.read(pid_read, 64))
    os.close(pid_read)
    report = ours.recv()
    return Confined(judge, runner, ours, report)


@contextlib.contextmanager
def confined(
    body: Callable[[Connection, ConfinementReport], Any], plan: ConfinementPlan = PLAN
) -> Iterator[Confined]:
    proc = spawn(body, plan)
    try:
        yield proc
    finally:
        proc.close()


def _marked(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if name.isdigit() and marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                found.append(int(name))
    return found


def _gone(marker: str, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while _marked(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_every_protection_is_in_force_and_holds_when_tried() -> None:
    found = probe()
    assert [p.name for p in found] == list(PROTECTIONS)
    # a protection confine() reported in force but that gave way when tried fails; one missing skips
    broken = [
        f"{p.name}: {p.detail}" for p in found if not p.in_force and not p.detail.startswith(p.name + ":")
    ]
    assert not broken
    missing = [p.detail for p in found if not p.in_force]
    if missing:
        pytest.skip("; ".join(missing))


def test_env_allow_list_withholds_secrets_even_under_an_allowed_prefix() -> None:
    allow = ("LANG", "POCL_*", "OMP_*")
    assert env_allowed("LANG", allow) and env_allowed("POCL_DEVICES", allow)
    assert not env_allowed("POCL_SECRET_KEY", allow) and not env_allowed("OMP_API_TOKEN", allow)
    assert not env_allowed("HOME", allow) and not env_allowed("LANGX", allow)


def test_secrets_in_the_environment_are_not_readable() -> None:
    script = textwrap.dedent(
        """
        import json, os, sys
        from kfoundry.core.evaluation.confine import ConfinementPlan, confine, new_pid_namespace
        os.environ["KF_LATE_SECRET_TOKEN"] = "late-canary"  # set after exec, as a parent would
        r, w = os.pipe()
        new_pid_namespace()
        if os.fork() == 0:
            report = confine(ConfinementPlan(scratch_mb=8, keep_fds=(w,)))
            seen = {
                "environ": dict(os.environ),
                "proc": open("/proc/self/environ", "rb").read().decode(errors="replace"),
                "in_force": report.in_force["environment"],
            }
            os.write(w, json.dumps(seen).encode())
            os._exit(0)
        os.close(w)
        sys.stdout.write(os.read(r, 1 << 20).decode())
        os.wait()
        """
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENAI_API_KEY": "sk-canary",
        "KF_TEST_SECRET_TOKEN": "tok-canary",
        "POCL_SECRET_KEY": "pocl-canary",
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    seen = json.loads(done.stdout or "{}")
    assert seen, done.stderr[-2000:]
    assert seen["in_force"]
    visible = json.dumps(seen["environ"]) + seen["proc"]
    for canary in ("sk-canary", "tok-canary", "pocl-canary", "late-canary"):
        assert canary not in visible
    assert seen["environ"]["OMP_NUM_THREADS"] == "1" and seen["environ"]["HOME"].startswith("/scratch")


def test_files_under_home_are_not_readable() -> None:
    canary = Path.home() / f".kf-canary-{secrets.token_hex(4)}"
    canary.write_text("secret")
    try:

        def body(conn: Connection, report: ConfinementReport) -> Any:
            try:
                return canary.read_text()
            except OSError as exc:
                return [exc.errno, os.path.exists(sys.executable), sorted(os.listdir(canary.parent))]

        with confined(body) as proc:
            proc.need("filesystem")
            result = proc.answer()
    finally:
        canary.unlink()
    assert result != "secret"
    err, python_visible, home_listing = result
    assert err in (errno.ENOENT, errno.EACCES) and python_visible
    assert canary.name not in home_listing


def test_no_tcp_or_abstract_socket_reaches_outside() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX)
    name = f"\0kf-canary-{secrets.token_hex(4)}"
    abstract.bind(name)
    abstract.listen(1)

    def body(conn: Connection, report: ConfinementReport) -> Any:
        out = []
        for family, address in ((socket.AF_INET, ("127.0.0.1", port)), (socket.AF_UNIX, name)):
            sock = socket.socket(family)
            sock.settimeout(1)
            try:
                sock.connect(address)
                out.append("connected")
            except OSError as exc:
                out.append(exc.strerror or str(exc))
            sock.close()
        return out

    try:
        with confined(body) as proc:
            proc.need("network")
            results = proc.answer()
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            pass  # the server does accept connections from outside
    finally:
        server.close()
        abstract.close()
    assert "connected" not in results, results


def test_writes_land_only_in_the_capped_scratch() -> None:
    name = f"kf-write-{secrets.token_hex(4)}"
    targets = [f"/tmp/{name}", str(REPO / name), str(Path.home() / name), f"/{name}", f"{sys.prefix}/{name}"]

    def body(conn: Connection, report: ConfinementReport) -> Any:
        wrote = {}
        for target in targets + [f"{report.scratch}/{name}"]:
            key = "scratch" if target.startswith(report.scratch) else target
            try:
                Path(target).write_text("x")
                wrote[key] = "ok"
            except OSError as exc:
                wrote[key] = exc.strerror or str(exc)
        errors = []
        for size_mb, file in ((9, "big"), (7, "a"), (7, "b")):  # max_file_mb 8, scratch 16
            try:
                with open(f"{report.scratch}/{file}", "wb") as out:
                    for _ in range(size_mb):
                        out.write(b"\0" * 2**20)
                errors.append(0)
            except OSError as exc:
                errors.append(exc.errno)
        return wrote, errors

    with confined(body, ConfinementPlan(scratch_mb=16, max_file_mb=8)) as proc:
        proc.need("filesystem", "scratch_cap", "limits")
        wrote, errors = proc.answer()
    for target in targets:
        assert not os.path.exists(target), f"{target} was written on the host"
    assert (
        wrote[f"/{name}"] != "ok"
        and wrote[str(REPO / name)] != "ok"
        and wrote[str(Path.home() / name)] != "ok"
    )
    assert wrote["scratch"] == "ok"
    assert errors == [errno.EFBIG, 0, errno.ENOSPC]


def _start_daemon(marker: str) -> Callable[[Connection, ConfinementReport], Any]:
    """A runner body that leaves a setsid, double-forked grandchild (``sh`` with ``marker``) behind."""

    def body(conn: Connection, report: ConfinementReport) -> Any:
        ready_read, ready_write = os.pipe2(os.O_CLOEXEC)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.close(ready_read)
                os.execv("/bin/sh", ["sh", "-c", f"sleep 60; : {marker}"])
            os._exit(0)
        os.close(ready_write)
        os.read(ready_read, 1)  # EOF once the grandchild has exec'd
        os.wait()
        conn.send("started")
        conn.recv()  # until told to end
        return "ending"

    return body


def test_no_process_outlives_the_runner() -> None:
    marker = f"kf-marker-{secrets.token_hex(4)}"
    with confined(_start_daemon(marker)) as proc:
        proc.need("pid_namespace")
        assert proc.answer() == "started"
        assert _marked(marker), "the grandchild never ran"
        assert len(tree_members(proc.runner)) >= 2
        assert proc.ask("end") == "ending"
        proc.close()
        assert _gone(marker)


def test_kill_tree_leaves_nothing() -> None:
    marker = f"kf-marker-{secrets.token_hex(4)}"
    with confined(_start_daemon(marker)) as proc:
        proc.need("pid_namespace")
        assert proc.answer() == "started" and _marked(marker)
        kill_tree(proc.runner)
        assert _gone(marker)
        assert os.WIFEXITED(proc.close())


def test_freeze_stops_a_busy_thread_and_thaw_resumes_it() -> None:
    shared = mmap.mmap(-1, 8)
    counter = ctypes.c_uint64.from_buffer(shared)

    def body(conn: Connection, report: ConfinementReport) -> Any:
        def spin() -> None:
            while True:
                counter.value += 1

        threading.Thread(target=spin, daemon=True).start()
        conn.recv()
        return "done"

    def advancing(seconds: float = 0.2) -> bool:
        before = counter.value
        time.sleep(seconds)
        return counter.value != before

    with confined(body) as proc:
        while counter.value == 0:
            time.sleep(0.01)
        assert advancing()
        freeze_tree(proc.runner)
        tasks = Path(f"/proc/{proc.runner}/task")
        states = {(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()}
        assert states == {"T"}, states
        assert not advancing()
        thaw_tree(proc.runner)
        assert advancing()
        assert proc.ask("end") == "done"


def test_the_judge_can_still_read_the_runners_memory() -> None:
    token = secrets.token_bytes(32)

    def body(conn: Connection, report: ConfinementReport) -> Any:
        buffer = ctypes.create_string_buffer(token, len(token))
        conn.send(ctypes.addressof(buffer))
        conn.recv()
        return buffer.raw

    with confined(body) as proc:
        proc.need("unprivileged")
        address = proc.answer()
        status = Path(f"/proc/{proc.runner}/status").read_text()
        assert "Uid:\t65534" in status or "Uid:\t0" not in status
        with open(f"/proc/{proc.runner}/mem", "rb") as mem:
            mem.seek(address)
            assert mem.read(len(token)) == token
        assert proc.ask("end") == token


_OPENCL_CONFINED = textwrap.dedent(
    """
    import json, os, sys
    from kfoundry.core.evaluation.confine import ConfinementPlan, confine
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        report = confine(ConfinementPlan(scratch_mb=256, keep_fds=(w,)))
        import numpy as np
        import pyopencl as cl
        import torch
        total = float(torch.ones(1000).sum())
        ctx = cl.Context(cl.get_platforms()[0].get_devices())
        queue = cl.CommandQueue(ctx)
        data = np.arange(16, dtype=np.float32)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)
        prg = cl.Program(ctx, "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }").build()
        prg.twice(queue, data.shape, None, buf)
        out = np.empty_like(data)
        cl.enqueue_copy(queue, out, buf)
        queue.finish()
        answer = {"in_force": report.in_force, "total": total, "out": out.tolist(),
                  "cache": os.listdir(os.environ["POCL_CACHE_DIR"])}
        os.write(w, json.dumps(answer).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.waitpid(pid, 0)
    print(data.decode())
    """
)


def test_torch_numpy_and_an_opencl_kernel_run_confined() -> None:
    """In a fresh interpreter (an OpenCL runtime this test process already initialised would keep its
    host cache path): torch, numpy and a real PoCL kernel build and run confined."""
    pytest.importorskip("pyopencl")
    done = subprocess.run(
        [sys.executable, "-c", _OPENCL_CONFINED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    if not (answer["in_force"].get("filesystem") and answer["in_force"].get("unprivileged")):
        pytest.skip(f"confinement not in force here: {answer['in_force']}")
    assert answer["total"] == 1000.0
    assert answer["out"] == [2.0 * i for i in range(16)]
    assert answer["cache"], "PoCL wrote no kernel cache into the scratch"
