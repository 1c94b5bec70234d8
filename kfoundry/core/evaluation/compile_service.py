"""Compile separated from the benchmark: the runner asks, a confined compile step compiles, the judge caches.

Whenever the runner's candidate code runs (building ``ModelNew``, and inside ``forward`` during the
correctness trials and timing), each ``kfoundry.runtime.load(SRC, defines=...)`` becomes a ``{"op": "compile", source, defines, build_options}`` request to the judge
(:class:`RemoteCompiler`, runner side). The judge (:meth:`CompileService.handle`, trusted) computes the
key from exactly those inputs plus the backend's options, toolchain and target (reported by the runner
before any candidate code ran), looks it up in the run's :class:`~.compile_cache.CompileCache`, and on
a miss runs the compile in a **fresh confined child** (its own PID, mount and network namespaces, an
empty root with a scratch tmpfs, ``nobody``, rlimits; :func:`compile_confined`) with a timeout. The
artefact goes back to the runner in a sealed memfd and the runner loads it
(``clCreateProgramWithBinary`` / ``cuModuleLoadData`` / a HIP code object): the runner never writes
the cache and nothing it says about an artefact is used. A compile error is the candidate's
``compile_error`` with the compiler's log, as before. A request arrives in place of a reply
(:attr:`~.runner_handle.RunnerHandle.on_request`); the judge freezes the runner while it answers, and a
cache miss while the job holds the device's lane releases the lane for the compile
(:class:`~.compile_lane.DeviceLane`; not during timing).

Backends take part by having ``compile_artifact(source, *, defines, build_options, target, device)``
(bytes and a JSON-able meta; no device context needed for CUDA or HIP) and ``load_artifact(data, meta,
*, defines, build_options)``; the others compile in the runner as before.
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
from dataclasses import dataclass, field
from typing import Any

from kfoundry.core.backend import Backend, CompileFailed, KernelModule
from kfoundry.core.evaluation.channel import Channel, ChannelClosed
from kfoundry.core.evaluation.compile_cache import Artifact, CompileCache, compile_key
from kfoundry.core.evaluation.compile_lane import DeviceLane
from kfoundry.core.evaluation.jobs import EvalJob
from kfoundry.core.evaluation.runner_handle import JobFailed

#: Largest source, define count and artefact a compile request may involve.
MAX_SOURCE = 1 << 20
MAX_DEFINES = 256
MAX_ARTIFACT = 64 << 20
_LENGTH = struct.Struct("!Q")


def supports_artifacts(backend: Backend) -> bool:
    """Whether the backend compiles to artefacts in a separate step and loads them."""
    return callable(getattr(backend, "compile_artifact", None)) and callable(
        getattr(backend, "load_artifact", None)
    )


def runner_compile_info(backend: Backend) -> dict[str, str] | None:
    """What the key needs from the runner's backend (toolchain, target), taken before candidate code runs."""
    if not supports_artifacts(backend):
        return None
    target = getattr(backend, "artifact_target", None)
    try:
        return {"toolchain": backend.toolchain_version(), "target": str(target() if callable(target) else "")}
    except Exception:  # no toolchain here: the runner compiles itself
        return None


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


# -- the judge's side ---------------------------------------------------------------------------------


@dataclass
class CompileService:
    """Answers the runner's compile requests for one job (the judge's side)."""

    job: EvalJob
    toolchain: str
    target: str
    cache: CompileCache | None = None
    #: one entry per request: key prefix, kernels, whether served from the cache, seconds
    records: list[dict[str, Any]] = field(default_factory=list)
    #: the job's deadline (``time.monotonic``): no compile runs past it
    deadline: float = float("inf")
    #: the job's device lane once it holds it: released for a cache-miss compile where it may be
    lane: DeviceLane | None = None

    @classmethod
    def for_job(cls, job: EvalJob, info: Any) -> CompileService | None:
        """The service for ``job`` given the runner's ``compile`` report (None: the runner compiles itself)."""
        ev = job.evaluation
        if not ev.compile_cache or not isinstance(info, dict):
            return None
        toolchain, target = info.get("toolchain"), info.get("target")
        if not isinstance(toolchain, str) or not isinstance(target, str):
            return None
        cache = None
        if job.compile_cache_dir:
            with contextlib.suppress(OSError):
                cache = CompileCache(job.compile_cache_dir, ev.compile_cache_mb * 2**20)
        return cls(job, toolchain[:500], target[:200], cache)

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        """The answer to one compile request: ``{"ok": True}`` with the artefact's memfd, or the error."""
        source, defines, options = request.get("source"), request.get("defines"), request.get("build_options")
        if not isinstance(source, str) or len(source) > MAX_SOURCE:
            return {"error": "compile request: the source is not text or exceeds 1 MiB"}, []
        if defines is not None and (not isinstance(defines, dict) or len(defines) > MAX_DEFINES):
            return {"error": "compile request: defines must be an object of at most 256 names"}, []
        if defines and not all(isinstance(v, (bool, int, float, str)) for v in defines.values()):
            return {"error": "compile request: a define's value is not a number or text"}, []
        if options is not None and not (
            isinstance(options, list) and all(isinstance(o, str) for o in options)
        ):
            return {"error": "compile request: build_options must be a list of strings"}, []
        inputs = {"source": source, "defines": defines or None, "build_options": options or None}
        key = compile_key(
            self.job.backend, source, defines, options, self.job.backend_options, self.toolchain, self.target
        )
        started = time.perf_counter()
        artifact = self.cache.get(key) if self.cache is not None else None
        cached = artifact is not None
        released = 0.0
        if artifact is None:
            lane = self.lane if self.lane is not None else DeviceLane(None)
            try:
                with lane.released_for_compile() as was_released:
                    gave_up = time.perf_counter()
                    left = max(1.0, self.deadline - time.monotonic())
                    timeout = min(self.job.evaluation.compile_timeout_s, left)
                    try:
                        artifact = compile_confined(self.job, inputs, self.target, timeout)
                    finally:
                        released = time.perf_counter() - gave_up if was_released else 0.0
            except CompileFailed as exc:
                failed = {"key": key[:16], "cached": False, "error": str(exc)[:200]}
                self.records.append({**failed, **self._lane_note(lane, released)})
                return {"error": str(exc), "log": exc.log[-20000:], "kind": "compile_error"}, []
            if self.cache is not None:
                with contextlib.suppress(OSError):
                    self.cache.put(key, artifact)
        seconds = time.perf_counter() - started
        kernels, unconfined = artifact.meta.get("kernels"), artifact.meta.get("unconfined")
        record: dict[str, Any] = {
            "key": key[:16],
            "cached": cached,
            "seconds": round(seconds, 4),
            "kernels": [str(k) for k in kernels][:64] if isinstance(kernels, list) else [],
            **self._lane_note(self.lane, released),
        }
        if unconfined and not cached:  # protections the compile step lacked (as a runner's are logged)
            record["unconfined"] = [str(u) for u in unconfined][:16]
        self.records.append(record)
        return {"ok": True, "cached": cached}, [_sealed_memfd(pack(artifact))]

    @staticmethod
    def _lane_note(lane: DeviceLane | None, released: float) -> dict[str, Any]:
        """Where the compile ran relative to the lane: ``lane_released_s``, or ``in_lane`` (timing)."""
        if released:
            return {"lane_released_s": round(released, 4)}
        if lane is not None and lane.held:
            return {"in_lane": True}
        return {}

    def summary(self) -> str:
        hits = sum(1 for r in self.records if r.get("cached"))
        return (
            f"compile service: {len(self.records)} program(s), {hits} from the cache"
            + (f" ({self.cache.folder})" if self.cache is not None else " (no cache folder)")
            + "".join(
                f"; {','.join(r.get('kernels') or []) or r['key']}: "
                + ("cached" if r.get("cached") else f"compiled {r.get('seconds', 0):.2f} s")
                for r in self.records
                if "error" not in r
            )
        )


def build_with_service(runner: Any, service: CompileService | None) -> dict[str, Any]:
    """The ``build`` exchange; from here on the runner's compile requests, in the build and in every
    later call, are answered by ``service`` (:func:`serve_request`). Returns the build's answer."""
    if service is not None:
        service.deadline = runner.deadline
        runner.on_request = lambda request: serve_request(runner, service, request)
    runner.thaw()
    try:
        runner.chan.send({"op": "build", "compile_service": service is not None})
    except ChannelClosed:
        raise JobFailed(runner.crashed()) from None
    reply: dict[str, Any] = runner.receive()
    runner.freeze()
    return reply


def serve_request(runner: Any, service: CompileService, request: dict[str, Any]) -> None:
    """Answer one compile request (it came in place of a reply): the runner is frozen meanwhile, so
    none of its code runs while the judge compiles (and, in the correctness trials, holds no lane)."""
    was_frozen = runner.frozen
    runner.freeze()
    try:
        answer, fds = service.handle(request)
    finally:
        if not was_frozen:
            runner.thaw()
    try:
        runner.chan.send(answer, fds)
    except ChannelClosed:
        pass  # the runner is gone: the next receive says so
    finally:
        for fd in fds:
            os.close(fd)


# -- the runner's side ------------------------------------------------------------------------------


class RemoteCompiler:
    """The runner's ``backend.load`` (in the build and inside calls): compiles through the judge, loads
    the artefact. It synchronizes the device before it asks, so the judge may give the lane up."""

    def __init__(self, chan: Channel, backend: Backend) -> None:
        self.chan = chan
        self.backend = backend
        self.local = backend.load
        self.active = True
        self.requests = 0

    def __call__(
        self,
        source: str,
        *,
        defines: dict[str, Any] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        if not self.active:
            return self.local(source, defines=defines, build_options=build_options)
        self.backend.synchronize()  # no device work of this job left queued while the lane is given up
        self.requests += 1
        self.chan.send(
            {"op": "compile", "source": source, "defines": defines, "build_options": build_options}
        )
        fds: list[int] = []
        answer = self.chan.recv(fds=fds)
        if answer.get("ok") is not True:
            for fd in fds:
                os.close(fd)
            raise CompileFailed(str(answer.get("error", "compile failed")), log=str(answer.get("log", "")))
        artifact = unpack(_read_fd(fds[0]))
        for fd in fds[1:]:
            os.close(fd)
        module: KernelModule = self.backend.load_artifact(  # type: ignore[attr-defined]
            artifact.data, artifact.meta, defines=defines, build_options=build_options
        )
        return module
