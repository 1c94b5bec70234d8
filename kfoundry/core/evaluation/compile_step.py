"""The confined compile step and the artefact's wire format (compile child -> judge -> runner).

:func:`compile_confined` forks a fresh child (its own PID, mount and network namespaces, an empty root
with a scratch tmpfs, ``nobody``, rlimits) that builds the job's backend, compiles one request and
writes ``meta + bytes`` back; :func:`pack` / :func:`unpack` are that format, and :func:`_sealed_memfd`
hands an artefact to the runner sealed against writes. Used by :mod:`.compile_service`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import struct
import time
from typing import Any

from kfoundry.core.backend import CompileFailed
from kfoundry.core.evaluation.compile_cache import Artifact
from kfoundry.core.evaluation.jobs import EvalJob

#: Largest source and artefact a compile request may involve.
MAX_SOURCE = 1 << 20
MAX_ARTIFACT = 64 << 20
_LENGTH = struct.Struct("!Q")


# -- the artefact's wire format (judge -> runner, compile child -> judge) -------------------------


def pack(artifact: Artifact) -> bytes:
    meta = json.dumps(artifact.meta).encode()
    return _LENGTH.pack(len(meta)) + meta + artifact.data


def unpack(blob: bytes) -> Artifact:
    (size,) = _LENGTH.unpack_from(blob)
    meta = json.loads(blob[_LENGTH.size : _LENGTH.size + size])
    if not isinstance(meta, dict):
        raise ValueError("artefact meta is not an object")
    return Artifact(blob[_LENGTH.size + size :], meta)


def _sealed_memfd(blob: bytes) -> int:
    fd = os.memfd_create("kf-artifact", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    view = memoryview(blob)
    while view:
        view = view[os.write(fd, view) :]
    seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def _read_fd(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as handle:
        handle.seek(0)
        return handle.read()


# -- the confined compile step ----------------------------------------------------------------------


def compile_confined(job: EvalJob, request: dict[str, Any], target: str, timeout_s: float) -> Artifact:
    """Compile in a fresh confined child (no network, no files but the system's, a scratch tmpfs,
    ``nobody``, its own PID namespace); raise :class:`CompileFailed` with the log, or on its timeout."""
    from kfoundry.core.evaluation import confine
    from kfoundry.core.evaluation.runner_handle import _setns

    read_end, write_end = os.pipe()
    own_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY)
    separate = confine.new_pid_namespace()
    pid = os.fork()
    if pid == 0:  # the compile step: never returns
        os.close(read_end)
        os.close(own_namespace)
        _compile_child(job, request, target, write_end)
    os.close(write_end)
    if separate:
        _setns(own_namespace)
    os.close(own_namespace)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                raise CompileFailed(f"compile timed out after {timeout_s:g} s (killed)")
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            if sum(map(len, chunks)) > MAX_ARTIFACT + MAX_SOURCE:
                raise CompileFailed("the compile step's output exceeds the artefact limit")
    finally:
        os.close(read_end)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
    try:
        answer = unpack(b"".join(chunks))
    except (ValueError, struct.error):
        raise CompileFailed("the compile step died without an answer") from None
    if answer.meta.get("error") is not None:
        raise CompileFailed(str(answer.meta["error"])[:2000], log=str(answer.meta.get("log", ""))[-20000:])
    return answer


def _compile_child(job: EvalJob, request: dict[str, Any], target: str, out: int) -> None:
    from kfoundry.core.evaluation import confine
    from kfoundry.core.plugins import get_plugin

    status = 0
    try:
        ev = job.evaluation
        plan = confine.ConfinementPlan(
            scratch_mb=ev.scratch_mb,
            keep_fds=(out,),
            memory_mb=None if job.on_gpu or job.backend == "cuda" else ev.memory_limit_mb,
            max_processes=64,
            uid=3_500_000 + os.getpid() % 1_000_000,
        )
        report = confine.confine(plan)
        backend = get_plugin("backend", job.backend).build(job.backend_options)
        data, meta = backend.compile_artifact(
            request["source"],
            defines=request.get("defines"),
            build_options=request.get("build_options"),
            target=target,
            device=job.device,
        )
        blob = pack(Artifact(bytes(data), {**meta, "unconfined": report.missing()}))
    except CompileFailed as exc:
        blob = pack(Artifact(b"", {"error": str(exc), "log": exc.log}))
    except BaseException as exc:
        blob = pack(Artifact(b"", {"error": f"compile step: {type(exc).__name__}: {exc}"[:2000]}))
        status = 1
    with contextlib.suppress(OSError):
        view = memoryview(blob)
        while view:
            view = view[os.write(out, view) :]
    os._exit(status)
