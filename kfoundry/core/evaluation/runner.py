"""The untrusted side: the process that runs a candidate's Python and kernels, and nothing else.

Forked by the judge (:mod:`.worker`) before the judge draws a seed or builds a reference, it loads
the problem variants and the backend while still trusted, then confines itself
(:func:`~kfoundry.core.evaluation.confine.confine`: no secrets, no network, read-only files, a PID
namespace) and only then executes candidate code. It answers the judge's commands over a
:class:`~kfoundry.core.evaluation.channel.Channel`:

- ``arena`` (+ a memfd): map the shared input arena;
- ``slots``: build argument lists over the arena (views, no copies); on a GPU with CUDA IPC, tensor
  arguments are the judge's own device buffers instead, opened from the handles it sends;
- ``call``: drop the previous call's outputs, run ``model(*slot)`` for each slot in order, synchronise,
  and say where each output lives (address, dtype, shape, stride); the judge reads them itself;
- ``fetch``: copy device outputs to host memory (device backends without CUDA IPC only; with it, each
  call's answer carries an IPC handle per output and the judge copies outputs out itself);
- ``exit``.

Nothing the runner says is trusted: the judge validates every reply, reads outputs out of the frozen
process's memory and keeps its own clock.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from typing import Any

import torch

from kfoundry import runtime
from kfoundry.core.backend import Backend, CompileFailed, KernelModule
from kfoundry.core.errors import KfError
from kfoundry.core.evaluation import audit_guard
from kfoundry.core.evaluation.arena import RunnerArena
from kfoundry.core.evaluation.channel import Channel
from kfoundry.core.evaluation.device_share import RunnerShares
from kfoundry.core.evaluation.guard import LAUNCH_CODES, ForwardGuard
from kfoundry.core.evaluation.jobs import EvalJob
from kfoundry.core.evaluation.runner_calls import (
    _ipc_usable,
    describe,
)
from kfoundry.core.problem import CandidateBuildError, Problem, as_tensor_list


class _Recorder:
    """Wraps a backend's ``load`` to keep every module the candidate compiles (logs, resources)."""

    def __init__(self, backend: Backend) -> None:
        self.modules: list[KernelModule] = []
        self._cache: dict[str, KernelModule] = {}
        self.launches = 0
        self._load = backend.load

    def __call__(self, source: str, **kwargs: Any) -> KernelModule:
        # the same program for every shape variant's model is compiled once per job
        key = repr((source, sorted((kwargs.get("defines") or {}).items()), kwargs.get("build_options")))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        module = self._load(source, **kwargs)
        self._cache[key] = module
        kernels = module.__dict__.get("_kernels")
        if isinstance(kernels, dict):
            for name, launch in list(kernels.items()):
                kernels[name] = self._counting(launch)
        self.modules.append(module)
        return module

    def _counting(self, launch: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.launches += 1
            return launch(*args, **kwargs)

        return counted


LAUNCH_CODES.add(_Recorder._counting(_Recorder.__new__(_Recorder), None).__code__)


def own_launches(backend: Backend) -> int:
    """Launches a backend counts itself, past ``load`` (Triton's ``kernel[grid](...)``): ``launch_count``."""
    count = getattr(backend, "launch_count", 0)
    return count if isinstance(count, int) else 0


def candidate_traceback(exc: BaseException) -> str:
    """Traceback limited to the candidate's own frames where possible."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    own = [ln for ln in lines if "<candidate>" in ln or not ln.startswith("  File")]
    return "".join(own)[-4000:]


def build_backend(job: EvalJob) -> Backend:
    """The job's backend, by name through the plugin registry, with its device selected."""
    from kfoundry.core.evaluation.compile_discovery import device_free
    from kfoundry.core.plugins import get_plugin

    backend = get_plugin("backend", job.backend).build(job.backend_options)
    if device_free(job, backend):  # a compile job: for the driver's device, all on the host
        backend.device, backend.torch_device = job.device_profile, "cpu"
        return backend
    backend.select_device(job.device)
    return backend


class Runner:
    """State of the runner process between commands."""

    def __init__(
        self, chan: Channel, job: EvalJob, problems: list[Problem], backend: Backend, device_timer: Any = None
    ) -> None:
        self.chan = chan
        self.job = job
        self.problems = problems
        self.backend = backend
        self.models: list[Any] = []
        self.arena: RunnerArena | None = None
        self.slots: list[list[Any]] = []
        self.device_slots: dict[int, list[Any]] = {}
        self.outputs: list[list[Any]] = []
        self.host_copies: list[list[Any]] = []
        self.recorder = _Recorder(backend)
        #: built once, before candidate code runs (its flush buffer and events are reused)
        self.device_timer = device_timer
        self.shares = RunnerShares(backend.torch_device) if _ipc_usable(backend) else None

    # -- building --------------------------------------------------------------------------------

    def build(self) -> dict[str, Any]:
        """Build the model of every variant; variant 0 must build, later ones may fail (noted)."""
        recorder = self.recorder = _Recorder(self.backend)
        self.backend.load = recorder  # type: ignore[method-assign]
        device = self.backend.torch_device
        notes: list[str] = []
        start = time.perf_counter()
        for v, problem in enumerate(self.problems):
            try:
                if self.job.kind == "reference":
                    model = problem.make_reference().to(device)
                else:
                    assert self.job.candidate is not None
                    model = problem.build_candidate(self.job.candidate, runtime.load, seed=0).to(device)
            except CompileFailed as exc:
                if v == 0:
                    return {"error": str(exc), "kind": "compile_error", "log": exc.log}
                notes.append(f"variant {v}: {str(exc).splitlines()[0] if str(exc) else 'compile failed'}")
                model = None
            except CandidateBuildError as exc:
                if v == 0:
                    return {"error": str(exc), "kind": "compile_error"}
                notes.append(f"variant {v}: {exc}")
                model = None
            except Exception as exc:
                if v == 0:
                    return {
                        "error": f"building ModelNew: {type(exc).__name__}: {exc}",
                        "kind": "runtime_error",
                        "log": candidate_traceback(exc),
                    }
                notes.append(f"variant {v}: building ModelNew: {type(exc).__name__}: {exc}"[:300])
                model = None
            self.models.append(model)
            if v == 0:
                compile_s = time.perf_counter() - start
        return {"ok": True, "compile_s": compile_s, "notes": notes, **self._module_info(recorder)}

    def _module_info(self, recorder: _Recorder) -> dict[str, Any]:
        resources: dict[str, Any] = {}
        for m in recorder.modules:
            resources.update(m.resources)
        logs = "\n".join(m.log for m in recorder.modules if m.log)
        return {"resources": _jsonable(resources), "log": logs[-8000:]}

    # -- commands --------------------------------------------------------------------------------

    def call(self, variant: int, order: list[int], device_timing: bool = False) -> dict[str, Any]:
        self.outputs = []
        self.host_copies = []
        timer = self.device_timer if device_timing else None
        device_ms: list[float] = []
        model = self.models[variant] if 0 <= variant < len(self.models) else None
        if model is None:
            return {"error": f"variant {variant} has no model", "kind": "runtime_error"}
        guard = ForwardGuard(poison_fresh=False) if self.job.kind == "evaluate" else None
        described: list[list[list[Any]]] = []
        launched = self.recorder.launches + own_launches(self.backend)
        marks = [time.perf_counter()]  # diagnostics only (the judge trusts none of it)
        try:
            with torch.no_grad(), guard or contextlib.nullcontext():
                for slot in order:
                    args = self.device_slots.get(slot) or self.slots[slot]
                    if timer is None:
                        self.outputs.append(as_tensor_list(model(*args)))
                        continue
                    box: list[Any] = []

                    def run(a: list[Any] = args, b: list[Any] = box) -> None:
                        b.append(model(*a))

                    device_ms.append(timer(run))
                    self.outputs.append(as_tensor_list(box[0]))
            marks.append(time.perf_counter())
            self.backend.synchronize()
            marks.append(time.perf_counter())
            for outs in self.outputs:
                described.append([describe(o) for o in outs])
            shares = self._share(self.outputs)
            marks.append(time.perf_counter())
        except KfError as exc:
            return refused_or({"error": str(exc), "kind": "runtime_error"})
        except Exception as exc:
            return refused_or(
                {
                    "error": f"{type(exc).__name__}: {exc}",
                    "kind": "runtime_error",
                    "log": candidate_traceback(exc),
                }
            )
        reply: dict[str, Any] = {
            "ok": True,
            "outs": described,
            "launches": self.recorder.launches + own_launches(self.backend) - launched,
        }
        if shares is not None:
            reply["shares"] = shares
        if timer is not None:
            reply["device_ms"] = device_ms
            reply["phase_ms"] = [round((b - a) * 1e3, 4) for a, b in zip(marks, marks[1:], strict=False)]
        if guard is not None:
            reply["forbidden"] = guard.forbidden[:20]
            reply["threads"] = guard.threads[:20]
        reply["library"] = audit_guard.offences()
        return reply

    def _share(self, outputs: list[list[Any]]) -> list[list[Any]] | None:
        """An IPC handle per device output (None where one cannot be made), with CUDA IPC only."""
        if self.shares is None:
            return None
        shares = self.shares
        return [
            [shares.export(o) if type(o) is torch.Tensor and o.is_cuda else None for o in outs]
            for outs in outputs
        ]

    def slots_from(self, message: dict[str, Any]) -> None:
        """Argument lists over the arena; tensor arguments on the judge's device buffers where it sent them."""
        assert self.arena is not None
        device = message.get("device")
        for i, descriptor in enumerate(message["slots"]):
            if isinstance(device, list) and self.shares is not None:
                shares = self.shares
                args = [
                    shares.import_input(h) if h is not None else item[1]
                    for item, h in zip(descriptor, device[i], strict=True)
                ]
                self.device_slots[len(self.slots)] = args
            else:
                args = self.arena.arguments(descriptor)
            self.slots.append(args)

    def fetch(self, calls: list[int]) -> dict[str, Any]:
        """Host copies of the given calls' device outputs (device backends only)."""
        described: list[list[list[Any]]] = []
        for i in calls:
            outs = self.outputs[i] if 0 <= i < len(self.outputs) else []
            host = [o.detach().to("cpu") if type(o) is torch.Tensor else o for o in outs]
            self.host_copies.append(host)
            described.append([describe(o) for o in host])
        return {"ok": True, "outs": described}

    def stage(self, slots: list[int]) -> dict[str, Any]:
        """Device copies of host slots (device backends: the kernel reads device memory)."""
        device = self.backend.torch_device
        for s in slots:
            staged = self.device_slots.get(s)
            if staged is None:
                self.device_slots[s] = [
                    a.to(device) if isinstance(a, torch.Tensor) else a for a in self.slots[s]
                ]
                continue
            for dst, src in zip(staged, self.slots[s], strict=True):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src, non_blocking=False)
        self.backend.synchronize()
        return {"ok": True}

    def serve(self) -> None:
        while True:
            fds: list[int] = []
            message = self.chan.recv(fds=fds)
            op = message.get("op")
            if op == "arena":
                self.arena = RunnerArena(fds[0], int(message["capacity"]))
                self.slots = []
                self.device_slots = {}
                reply: dict[str, Any] = {"ok": True}
            elif op == "slots":
                self.slots_from(message)
                reply = {"ok": True}
            elif op == "stage":
                reply = self.stage(list(message["slots"]))
            elif op == "call":
                reply = self.call(
                    int(message["variant"]), list(message["order"]), bool(message.get("device_timing"))
                )
            elif op == "fetch":
                reply = self.fetch(list(message["calls"]))
            elif op == "discover" and self.job.kind == "compile":
                from kfoundry.core.evaluation.compile_discovery import discover_calls

                reply = discover_calls(self)
            elif op == "exit":
                return
            else:
                reply = {"error": f"unknown command {op!r}", "kind": "runtime_error"}
            self.chan.send(reply)


def refused_or(reply: dict[str, Any]) -> dict[str, Any]:
    """A failed reply becomes ``rejected`` when the audit hook refused something (the runner can only
    incriminate itself: a candidate that hides an offence still did not get what it asked for)."""
    refused = audit_guard.offences()
    if reply.get("ok") is True or not refused:
        return reply
    return {
        "error": f"computes with a library ({', '.join(refused[:5])}): compute must run in the candidate's own kernels",
        "kind": "rejected",
        "log": str(reply.get("error", ""))[:2000],
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
