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

import base64
import binascii
import contextlib
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from kfoundry.core.backend import Backend, CompileFailed, KernelModule
from kfoundry.core.evaluation.channel import Channel, ChannelClosed
from kfoundry.core.evaluation.compile_cache import Artifact, CompileCache, compile_key
from kfoundry.core.evaluation.compile_lane import DeviceLane
from kfoundry.core.evaluation.compile_step import (
    MAX_SOURCE,
    _read_fd,
    _sealed_memfd,
    compile_confined,
    pack,
    unpack,
)
from kfoundry.core.evaluation.jobs import EvalJob
from kfoundry.core.evaluation.runner_handle import JobFailed

#: Largest source, define count and artefact a compile request may involve.
MAX_DEFINES = 256


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
    toolchain = getattr(backend, "artifact_toolchain", None)  # what the artefact depends on, where narrower
    try:
        return {
            "toolchain": toolchain() if callable(toolchain) else backend.toolchain_version(),
            "target": str(target() if callable(target) else ""),
        }
    except Exception:  # no toolchain here: the runner compiles itself
        return None


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
    #: artefacts a compile job made for this candidate (key -> packed), served like cache entries
    seeds: dict[str, bytes] = field(default_factory=dict)
    #: keep every artefact served (a compile job ships them: :meth:`shipped`)
    keep: bool = False
    _kept: dict[str, bytes] = field(default_factory=dict)

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
        seeds: dict[str, bytes] = {}
        for key, text in list(job.seed_artifacts.items())[:256]:
            with contextlib.suppress(binascii.Error, ValueError):
                seeds[key] = base64.b64decode(text, validate=True)
        return cls(job, toolchain[:500], target[:200], cache, seeds=seeds)

    def _seeded(self, key: str) -> Artifact | None:
        """The compile job's artefact for ``key`` (stored in the cache too), or None."""
        blob = self.seeds.get(key)
        if blob is None:
            return None
        try:
            artifact = unpack(blob)
        except (ValueError, struct.error):
            return None
        if self.cache is not None:
            with contextlib.suppress(OSError):
                self.cache.put(key, artifact)
        return artifact

    def shipped(self, limit: int) -> dict[str, str]:
        """The artefacts kept (base64 of the packed artefact by key), up to ``limit`` bytes in all."""
        out: dict[str, str] = {}
        total = 0
        for key, blob in self._kept.items():
            total += len(blob)
            if total > limit:
                break
            out[key] = base64.b64encode(blob).decode()
        return out

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
        seeded = False
        if artifact is None:
            artifact = self._seeded(key)
            seeded = artifact is not None
        cached = artifact is not None
        seconds = time.perf_counter() - started
        released = 0.0
        if artifact is None:
            lane = self.lane if self.lane is not None else DeviceLane(None)
            was_released = False
            try:
                with lane.released_for_compile() as was_released:
                    begun = time.perf_counter()
                    left = max(1.0, self.deadline - time.monotonic())
                    timeout = min(self.job.evaluation.compile_timeout_s, left)
                    try:
                        artifact = compile_confined(self.job, inputs, self.target, timeout)
                    finally:  # the compile's own time (not the wait to take the lane again)
                        seconds += time.perf_counter() - begun
            except CompileFailed as exc:
                released = _last_release(lane, was_released)
                failed = {"key": key[:16], "cached": False, "error": str(exc)[:200]}
                self.records.append({**failed, **self._lane_note(lane, released)})
                return {"error": str(exc), "log": exc.log[-20000:], "kind": "compile_error"}, []
            released = _last_release(lane, was_released)
            if self.cache is not None:
                with contextlib.suppress(OSError):
                    self.cache.put(key, artifact)
        kernels, unconfined = artifact.meta.get("kernels"), artifact.meta.get("unconfined")
        record: dict[str, Any] = {
            "key": key[:16],
            "cached": cached,
            "seconds": round(seconds, 4),
            "kernels": [str(k) for k in kernels][:64] if isinstance(kernels, list) else [],
            **self._lane_note(self.lane, released),
        }
        if seeded:
            record["seeded"] = True  # made by this candidate's compile job
        if unconfined and not cached:  # protections the compile step lacked (as a runner's are logged)
            record["unconfined"] = [str(u) for u in unconfined][:16]
        self.records.append(record)
        blob = pack(artifact)
        if self.keep:
            self._kept[key] = blob
        return {"ok": True, "cached": cached}, [_sealed_memfd(blob)]

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


def _last_release(lane: DeviceLane, released: bool) -> float:
    """How long the lane was given up for the last compile (until it was taken again), or 0."""
    if not released or not lane.released:
        return 0.0
    start, end = lane.released[-1]
    return end - start


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

    def __init__(self, chan: Channel, backend: Backend, discover: bool = False) -> None:
        self.chan = chan
        self.backend = backend
        self.local = backend.load
        self.active = True
        self.requests = 0
        #: a compile job: the artefacts are not loaded (kernels that refuse to run stand in)
        self.discover = discover

    def __call__(
        self,
        source: str,
        *,
        defines: dict[str, Any] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        if not self.active:
            return self.local(source, defines=defines, build_options=build_options)
        if not self.discover:
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
        if self.discover:
            from kfoundry.core.evaluation.compile_discovery import unrunnable_module

            return unrunnable_module(artifact.meta)
        module: KernelModule = self.backend.load_artifact(  # type: ignore[attr-defined]
            artifact.data, artifact.meta, defines=defines, build_options=build_options
        )
        return module
