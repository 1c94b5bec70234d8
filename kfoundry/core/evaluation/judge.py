"""The judge: fresh inputs for every call, the runner's outputs read back and checked."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kfoundry.core.evaluation import device_share, extensions, procmem
from kfoundry.core.evaluation.arena import ARENA_NAME, Arena, view_of
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.evaluation.output_checks import aliases_input, check_description, mark_aliasing
from kfoundry.core.evaluation.runner_handle import JobFailed, RunnerHandle
from kfoundry.core.evaluation.tolerance import float64_reference
from kfoundry.core.evaluation.verifier import Verdict, check_outputs
from kfoundry.core.models import Outcome
from kfoundry.core.problem import Problem, as_tensor_list

#: With CUDA IPC, timed batches may hold this share of the free device memory in input sets, at most
#: this many bytes (a batch of a fast kernel must run long against the judge's clock).
DEVICE_ROTATE_SHARE = 0.1


DEVICE_ROTATE_MAX = 8 << 30


#: Extra bytes an output may span beyond its dense size before the judge refuses to read it.
_SPAN_SLACK = 1 << 20


def clone_values(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def nbytes(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


@dataclass
class Variant:
    """One shape set of the problem, with its reference on the judge's device."""

    index: int
    problem: Problem
    reference: Any
    label: str
    ok: bool = True


@dataclass
class Judge:
    """Everything trusted about one evaluation (see the module docstring)."""

    job: EvalJob
    runner: RunnerHandle
    device: str
    variants: list[Variant]
    log: list[str] = field(default_factory=list)
    arena: Arena | None = None
    slot_keys: dict[tuple[int, bool], int] = field(default_factory=dict)
    phases: list[tuple[str, float]] = field(default_factory=list)
    clock_disagreements: int = 0
    clock_used: str | None = None  # "events" or "judge": what the paired device timing counted
    timer_overhead_ms: float | None = None
    exchange_ms: float | None = None
    timer_overhead_error: float | None = None  # the calibrated per-call overhead's standard error
    exchange_fixed_ms: float | None = None  # a call exchange's fixed cost, trusted path (calibrate_calls)
    disagreement_samples: list[str] = field(default_factory=list)
    sandbox: dict[str, bool] = field(default_factory=dict)
    sandbox_notes: list[str] = field(default_factory=list)
    #: CUDA IPC: the judge's own input buffers (per slot, per argument) and the idle probe
    shared: device_share.JudgeBuffers | None = None
    owned: dict[int, list[device_share.OwnedBuffer | None]] = field(default_factory=dict)
    probe: device_share.IdleProbe | None = None
    last_shares: list[Any] = field(default_factory=list)
    #: the runner's own account of its last call (calls, sync, describe + share), ms: diagnostics only
    last_phases: list[float] = field(default_factory=list)
    #: per timed batch: (device events, judge's clock less calibrated overheads), ms
    clock_pairs: list[tuple[float, float]] = field(default_factory=list)
    #: candidate-built native libraries already inspected
    inspected: set[str] = field(default_factory=set)
    _phase_start: float = field(default_factory=time.monotonic)

    def check_native(self, when: str) -> None:
        """Reject a candidate whose own native code computes with a library (runner frozen)."""
        if self.job.kind != "evaluate":
            return
        found = extensions.inspect_runner(self.runner.pid, self.inspected)
        if found.libraries:
            self.log.append(f"native code the candidate loaded ({when}): {', '.join(found.libraries)[:600]}")
        if found.unreadable:
            self.log.append(f"could not inspect: {', '.join(found.unreadable)[:300]}")
        if found.offence is not None:
            raise JobFailed(JobResult(outcome=Outcome.rejected, message=found.offence))

    @property
    def settle(self) -> Callable[[], object] | None:
        return self.probe.wait_idle if self.probe is not None else None

    def phase(self, name: str) -> None:
        """Record the time since the last phase ended (for the log)."""
        now = time.monotonic()
        self.phases.append((name, now - self._phase_start))
        self._phase_start = now

    # -- arena and calls --------------------------------------------------------------------------

    def open_arena(self, capacity: int) -> Arena:
        if self.arena is not None:
            self.arena.close()
        self.arena = Arena(capacity)
        self.slot_keys = {}
        self.owned = {}  # earlier buffers stay allocated until the job ends (the runner still maps them)
        reply, _ = self.runner.exchange({"op": "arena", "capacity": self.arena.capacity}, [self.arena.fd])
        self._expect_ok(reply, "mapping the input arena")
        return self.arena

    def add_slots(self, values: list[list[Any]], aligned: bool = True) -> list[int]:
        assert self.arena is not None
        first = len(self.arena.slots)
        if self.shared is not None:  # tensors live in the judge's device buffers, not in the arena
            ids = [self.arena.describe_only(v) for v in values]
        else:
            ids = [self.arena.place(v, aligned) for v in values]
        message: dict[str, Any] = {"op": "slots", "slots": [self.arena.slots[i].descriptor for i in ids]}
        if self.shared is not None:
            shared = self.shared
            for i, v in zip(ids, values, strict=True):
                self.owned[i] = [
                    shared.allocate(a, aligned) if isinstance(a, torch.Tensor) else None for a in v
                ]
            self._write_owned(ids, values)
            message["device"] = [
                [b.descriptor() if b is not None else None for b in self.owned[i]] for i in ids
            ]
        reply, _ = self.runner.exchange(message)
        self._expect_ok(reply, "building argument views")
        if self.device != "cpu" and self.shared is None:
            reply, _ = self.runner.exchange({"op": "stage", "slots": list(range(first, first + len(ids)))})
            self._expect_ok(reply, "staging inputs on the device")
        return ids

    def _write_owned(self, ids: list[int], values: list[list[Any]]) -> None:
        for slot, v in zip(ids, values, strict=True):
            for buffer, value in zip(self.owned[slot], v, strict=True):
                if buffer is not None:
                    buffer.tensor.copy_(value.detach().reshape(buffer.tensor.shape))
        torch.cuda.synchronize()

    def write(self, ids: list[int], values: list[list[Any]]) -> None:
        """Fresh values into slots (runner frozen); device backends then stage them on the device
        (with CUDA IPC the judge writes its own device buffers: the runner is not asked)."""
        assert self.arena is not None
        if self.shared is not None:
            self._write_owned(ids, values)
            return
        for slot, v in zip(ids, values, strict=True):
            self.arena.write(slot, v)
        if self.device != "cpu":
            reply, _ = self.runner.exchange({"op": "stage", "slots": ids})
            self._expect_ok(reply, "staging inputs on the device")

    def _expect_ok(self, reply: dict[str, Any], what: str) -> None:
        if reply.get("ok") is True:
            return
        raise JobFailed(self._error_result(reply, what))

    def _error_result(self, reply: dict[str, Any], what: str) -> JobResult:
        message = str(reply.get("error", "no answer"))[:2000]
        kind = reply.get("kind")
        outcome = {"compile_error": Outcome.compile_error, "rejected": Outcome.rejected}.get(
            str(kind), Outcome.runtime_error
        )
        if "MemoryError" in message or "can't allocate" in message:
            message = f"out of memory (memory limit reached): {message}"
        return JobResult(outcome=outcome, message=f"{what}: {message}", log=str(reply.get("log", ""))[-4000:])

    def call(
        self, variant: int, order: list[int], what: str, device_timing: bool = False
    ) -> tuple[list[list[Any]], int, dict[str, Any]]:
        """Run the given slots on the runner (one clocked exchange): (output descriptors, ns, reply)."""
        message = {"op": "call", "variant": variant, "order": order, "device_timing": device_timing}
        reply, elapsed = self.runner.exchange(message, settle=self.settle)
        if reply.get("ok") is not True:
            raise JobFailed(self._error_result(reply, what))
        outs = reply.get("outs")
        if (
            not isinstance(outs, list)
            or len(outs) != len(order)
            or not all(isinstance(o, list) for o in outs)
        ):
            raise JobFailed(
                JobResult(outcome=Outcome.rejected, message=f"{what}: the runner's answer is malformed")
            )
        if self.shared is not None:
            shares = reply.get("shares")
            if (
                not isinstance(shares, list)
                or len(shares) != len(order)
                or not all(isinstance(x, list) for x in shares)
            ):
                raise JobFailed(
                    JobResult(outcome=Outcome.rejected, message=f"{what}: the runner's answer is malformed")
                )
            self.last_shares = shares
        phases = reply.get("phase_ms")
        self.last_phases = (
            [float(x) for x in phases[:4] if isinstance(x, (int, float))] if isinstance(phases, list) else []
        )
        self._policy(reply, what)
        return outs, elapsed, reply

    def _policy(self, reply: dict[str, Any], what: str) -> None:
        forbidden = [str(x) for x in reply.get("forbidden", []) or []][:10]
        threads = [str(x) for x in reply.get("threads", []) or []][:10]
        library = [str(x) for x in reply.get("library", []) or []][:5]
        if library:
            raise JobFailed(
                JobResult(
                    outcome=Outcome.rejected,
                    message=(
                        f"{what}: computes with a library ({', '.join(library)}): compute must run in the "
                        "candidate's own kernels"
                    ),
                )
            )
        if forbidden:
            raise JobFailed(
                JobResult(
                    outcome=Outcome.rejected,
                    message=f"forward computes with torch ({', '.join(forbidden)}): compute must run in a kernel",
                )
            )
        launches = reply.get("launches")
        if self.job.kind == "evaluate" and isinstance(launches, int) and launches < 1:
            raise JobFailed(
                JobResult(
                    outcome=Outcome.rejected,
                    message=(
                        f"{what}: forward launched no kernel: the work must run in the candidate's kernels"
                    ),
                )
            )
        if threads:
            names = ", ".join(dict.fromkeys(threads))
            raise JobFailed(
                JobResult(
                    outcome=Outcome.rejected,
                    message=(
                        f"{what}: forward started a thread ({names}): work that can finish after the clock stops is not allowed"
                    ),
                )
            )

    # -- reading outputs --------------------------------------------------------------------------

    def read_outputs(
        self, described: list[list[Any]], refs: list[Any], call_index: int
    ) -> list[Any] | Verdict:
        """The outputs the runner named, read from its frozen memory (or a Verdict if they cannot be)."""
        if len(described) != len(refs):
            return Verdict(Outcome.wrong_shape, f"returned {len(described)} outputs, expected {len(refs)}")
        if self.shared is not None:
            return self._read_shared(described, refs, call_index)
        if self.device != "cpu" and any(d and d[0] == "tensor" and d[-1] != "cpu" for d in described):
            reply, _ = self.runner.exchange({"op": "fetch", "calls": [call_index]})
            fetched = reply.get("outs")
            if reply.get("ok") is not True or not isinstance(fetched, list) or len(fetched) != 1:
                return Verdict(Outcome.runtime_error, "could not copy the outputs off the device")
            host = fetched[0]
            if not isinstance(host, list) or len(host) != len(described):
                return Verdict(Outcome.runtime_error, "could not copy the outputs off the device")
        else:
            host = described
        maps = procmem.mappings(self.runner.pid, ARENA_NAME)
        outs: list[Any] = []
        for i, (d, dev_d, ref) in enumerate(zip(host, described, refs, strict=True)):
            if not isinstance(ref, torch.Tensor):
                outs.append(None)
                continue
            checked = check_description(i, d, ref)
            if isinstance(checked, Verdict):
                return checked
            address, shape, stride, _where = checked
            expected_device = torch.device(self.device)
            if torch.device(dev_d[-1]).type != expected_device.type:
                return Verdict(Outcome.mismatch, f"output {i} is on {dev_d[-1]}, expected {self.device}")
            itemsize = ref.element_size()
            numel = ref.numel()
            if numel == 0:
                outs.append(torch.empty(ref.shape, dtype=ref.dtype, device=self.device))
                continue
            span = (sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1) * itemsize
            if span > numel * itemsize + _SPAN_SLACK:
                return Verdict(Outcome.rejected, f"output {i} spans {span} bytes for {numel} elements")
            if (
                dev_d[-1] == "cpu"
                and procmem.overlaps(maps, ARENA_NAME, address, address + span)
                and not aliases_input(ref)
            ):
                return Verdict(Outcome.rejected, f"output {i} aliases an input (the reference's does not)")
            try:
                raw = procmem.read_memory(self.runner.pid, address, span)
            except procmem.MemoryReadError as exc:
                if not self.runner.alive():
                    raise JobFailed(self.runner.crashed()) from None
                return Verdict(Outcome.runtime_error, f"output {i}: {exc}")
            flat = view_of(raw, 0, ref.dtype, [span // itemsize])
            tensor = flat.as_strided(shape, stride).contiguous()
            outs.append(tensor.to(self.device) if self.device != "cpu" else tensor)
        return outs

    def _read_shared(
        self, described: list[list[Any]], refs: list[Any], call_index: int
    ) -> list[Any] | Verdict:
        """Outputs copied out of the frozen runner's device memory through the IPC handles it named."""
        shares = self.last_shares[call_index] if 0 <= call_index < len(self.last_shares) else None
        if not isinstance(shares, list) or len(shares) != len(described):
            return Verdict(Outcome.rejected, "the runner named no shareable memory for its outputs")
        outs: list[Any] = []
        for i, (d, ref, share) in enumerate(zip(described, refs, shares, strict=True)):
            if not isinstance(ref, torch.Tensor):
                outs.append(None)
                continue
            checked = check_description(i, d, ref)
            if isinstance(checked, Verdict):
                return checked
            _address, shape, stride, where = checked
            if not str(where).startswith("cuda"):
                return Verdict(Outcome.mismatch, f"output {i} is on {where}, expected {self.device}")
            if ref.numel() == 0:
                outs.append(torch.empty(ref.shape, dtype=ref.dtype, device=self.device))
                continue
            if share is None:
                return Verdict(
                    Outcome.rejected,
                    (
                        f"output {i} is not in a device allocation of the candidate's own "
                        "(an input's memory, or memory that cannot be shared)"
                    ),
                )
            try:
                outs.append(
                    device_share.read_shared(share, ref.dtype, list(shape), list(stride), self.device)
                )
            except device_share.ShareError as exc:
                return Verdict(Outcome.rejected, f"output {i}: {exc}")
        return outs

    def inputs_changed(self, slot: int, inputs: list[Any]) -> int | None:
        """The first tensor argument of ``slot`` that no longer holds ``inputs`` (None: all unchanged)."""
        if self.shared is None:
            assert self.arena is not None
            return self.arena.unchanged(slot, inputs)
        for i, (buffer, value) in enumerate(zip(self.owned[slot], inputs, strict=True)):
            if buffer is None:
                continue
            now, was = buffer.tensor, value.detach().reshape(buffer.tensor.shape)
            if not torch.equal(now, was) and not (
                now.dtype.is_floating_point
                and torch.equal(now.isnan(), was.isnan())
                and torch.equal(now.nan_to_num(), was.nan_to_num())
            ):
                return i
        return None

    # -- checks -----------------------------------------------------------------------------------

    def reference(self, variant: Variant, inputs: list[Any]) -> tuple[list[Any], list[Any] | None]:
        with torch.no_grad():
            refs = as_tensor_list(variant.reference(*clone_values(inputs)))
        return refs, float64_reference(variant.reference, inputs)

    def check_call(
        self,
        variant: Variant,
        slot: int,
        inputs: list[Any],
        described: list[list[Any]],
        call_index: int,
        refs: list[Any],
        ref64: list[Any] | None,
    ) -> tuple[list[Any] | None, Verdict | None]:
        outs = self.read_outputs(described, refs, call_index)
        if isinstance(outs, Verdict):
            return None, outs
        changed = self.inputs_changed(slot, inputs)
        if changed is not None:
            return None, Verdict(Outcome.rejected, f"the candidate modified input {changed}")
        ev = self.job.evaluation
        verdict = check_outputs(outs, refs, ref64, ev.atol, ev.rtol)
        return outs, verdict


__all__ = ["Judge", "Variant", "check_description", "clone_values", "mark_aliasing", "nbytes"]
