"""The trusted side of one job: the judge.

:func:`execute` runs in a fresh child of the fork server (:mod:`.zygote`). Before it reads a seed or
builds a reference it forks the runner (:mod:`.runner`) — the process that executes the candidate,
confined and in its own PID namespace — and from then on it holds everything the candidate must not
reach: the trial seeds, the reference model and its outputs (float32 and float64), the checker and
the clock. Per call the judge

1. writes fresh inputs into the shared arena while the runner is frozen (SIGSTOP),
2. starts its own clock, thaws the runner, asks for the call(s), stops the clock at the answer and
   freezes the runner again — so no candidate code runs outside a clocked call, and work left
   running when the answer comes is still undone when the judge looks,
3. reads the outputs straight out of the frozen runner's memory and checks them.

On a GPU (CUDA) the inputs are the judge's own device buffers, shared by CUDA IPC and rewritten while
the runner is frozen; each answer names an IPC handle per output, which the judge opens and copies
itself (:mod:`.device_share`), so the runner is never thawed between a call and the check of its
outputs. Each clocked exchange ends only when a probe in the judge's own context finds the GPU idle
(work left queued on any stream is clocked), and a timed batch counts the judge's clock less what
the same exchange cost before candidate code ran, or the device events where they are larger.

Correctness runs many trials (the problem's inputs, boundary shapes, unaligned starts, signed,
normal, huge, tiny and NaN/Inf inputs, more for cheap kernels within a time budget); timing runs
batches of calls on distinct fresh inputs and verifies a random sample of every batch, plus its last
call, so timed calls cannot skip work unseen.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kfoundry.core.errors import KfError
from kfoundry.core.evaluation import confine, device_share, extensions, procmem
from kfoundry.core.evaluation.arena import ARENA_NAME, DTYPES, Arena, view_of
from kfoundry.core.evaluation.channel import Channel, ChannelClosed, ChannelTimeout, channel_pair
from kfoundry.core.evaluation.jobs import EvalJob, JobResult, describe_exit
from kfoundry.core.evaluation.timer import _clock_ns, summarize
from kfoundry.core.evaluation.tolerance import float64_reference
from kfoundry.core.evaluation.trials import TrialPlan, TrialSpec, domain_reason, plan_trials, transform_inputs
from kfoundry.core.evaluation.verifier import Verdict, check_independence, check_outputs
from kfoundry.core.models import Outcome, TimingStats
from kfoundry.core.problem import Problem, as_tensor_list, load_problem

#: Most distinct input sets in one timed batch.
MAX_BATCH = 512
#: With CUDA IPC, timed batches may hold this share of the free device memory in input sets, at most
#: this many bytes (a batch of a fast kernel must run long against the judge's clock).
DEVICE_ROTATE_SHARE = 0.1
DEVICE_ROTATE_MAX = 8 << 30
#: Extra bytes an output may span beyond its dense size before the judge refuses to read it.
_SPAN_SLACK = 1 << 20


class JobFailed(Exception):
    """Ends the job with this result."""

    def __init__(self, result: JobResult) -> None:
        super().__init__(result.message)
        self.result = result


def _clone(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _nbytes(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


@contextlib.contextmanager
def _device_lock(path: str | None) -> Iterator[None]:
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RunnerHandle:
    """The judge's grip on the runner process: commands, clock, freeze and kill."""

    def __init__(self, pid: int, chan: Channel, deadline: float, timeout_s: float) -> None:
        self.pid = pid
        self.chan = chan
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.status: int | None = None
        self.frozen = False
        self._frozen_members: list[int] = [pid]

    def _left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def receive(self) -> dict[str, Any]:
        try:
            return self.chan.recv(timeout=self._left())
        except ChannelTimeout:
            self.kill()
            raise JobFailed(JobResult(outcome=Outcome.timeout, message=f"timed out after {self.timeout_s:g} s (killed)")) from None
        except ChannelClosed:
            raise JobFailed(self.crashed()) from None

    def exchange(
        self, message: dict[str, Any], fds: list[int] | None = None, settle: Callable[[], object] | None = None
    ) -> tuple[dict[str, Any], int]:
        """Send ``message`` to the thawed runner, wait for its answer, freeze it: (answer, clocked ns).

        The clock starts before the runner is thawed and stops when the answer arrives, or, with
        ``settle`` (a GPU's idle probe), once the runner is frozen and ``settle`` has returned.
        """
        t0 = _clock_ns()
        self.thaw()
        try:
            self.chan.send(message, fds)
        except ChannelClosed:
            raise JobFailed(self.crashed()) from None
        reply = self.receive()
        if settle is None:
            elapsed = _clock_ns() - t0
            self.freeze()
            return reply, elapsed
        self.freeze()
        settle()
        return reply, _clock_ns() - t0

    def freeze(self) -> None:
        self._frozen_members = confine.freeze_tree(self.pid)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            confine.thaw_tree(self.pid, self._frozen_members)
            self.frozen = False

    def alive(self) -> bool:
        """Whether the runner still runs (reaps it if it ended)."""
        if self.status is not None:
            return False
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        self.status = status
        return False

    def crashed(self) -> JobResult:
        self.kill()
        return JobResult(outcome=Outcome.runtime_error, message=f"worker crashed: {describe_exit(self.status, 'the runner vanished')}")

    def kill(self) -> None:
        if self.status is not None:
            with contextlib.suppress(Exception):
                confine.kill_tree(self.pid)
            return
        with contextlib.suppress(Exception):
            confine.kill_tree(self.pid)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            _, self.status = os.waitpid(self.pid, 0)


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
    timer_overhead_ms: float | None = None
    exchange_ms: float | None = None
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
                self.owned[i] = [shared.allocate(a, aligned) if isinstance(a, torch.Tensor) else None for a in v]
            self._write_owned(ids, values)
            message["device"] = [[b.descriptor() if b is not None else None for b in self.owned[i]] for i in ids]
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
        outcome = Outcome.compile_error if kind == "compile_error" else Outcome.runtime_error
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
        if not isinstance(outs, list) or len(outs) != len(order) or not all(isinstance(o, list) for o in outs):
            raise JobFailed(JobResult(outcome=Outcome.rejected, message=f"{what}: the runner's answer is malformed"))
        if self.shared is not None:
            shares = reply.get("shares")
            if not isinstance(shares, list) or len(shares) != len(order) or not all(isinstance(x, list) for x in shares):
                raise JobFailed(JobResult(outcome=Outcome.rejected, message=f"{what}: the runner's answer is malformed"))
            self.last_shares = shares
        phases = reply.get("phase_ms")
        self.last_phases = [float(x) for x in phases[:4] if isinstance(x, (int, float))] if isinstance(phases, list) else []
        self._policy(reply, what)
        return outs, elapsed, reply

    def _policy(self, reply: dict[str, Any], what: str) -> None:
        forbidden = [str(x) for x in reply.get("forbidden", []) or []][:10]
        threads = [str(x) for x in reply.get("threads", []) or []][:10]
        if forbidden:
            raise JobFailed(JobResult(outcome=Outcome.rejected,
                                      message=f"forward computes with torch ({', '.join(forbidden)}): compute must run in a kernel"))
        launches = reply.get("launches")
        if self.job.kind == "evaluate" and isinstance(launches, int) and launches < 1:
            raise JobFailed(JobResult(outcome=Outcome.rejected, message=(
                f"{what}: forward launched no kernel: the work must run in the candidate's kernels")))
        if threads:
            names = ", ".join(dict.fromkeys(threads))
            raise JobFailed(JobResult(outcome=Outcome.rejected, message=(
                f"{what}: forward started a thread ({names}): work that can finish after the clock stops is not allowed")))

    # -- reading outputs --------------------------------------------------------------------------

    def read_outputs(self, described: list[list[Any]], refs: list[Any], call_index: int) -> list[Any] | Verdict:
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
            checked = _described(i, d, ref)
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
            if dev_d[-1] == "cpu" and procmem.overlaps(maps, ARENA_NAME, address, address + span) and not _aliases(ref):
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

    def _read_shared(self, described: list[list[Any]], refs: list[Any], call_index: int) -> list[Any] | Verdict:
        """Outputs copied out of the frozen runner's device memory through the IPC handles it named."""
        shares = self.last_shares[call_index] if 0 <= call_index < len(self.last_shares) else None
        if not isinstance(shares, list) or len(shares) != len(described):
            return Verdict(Outcome.rejected, "the runner named no shareable memory for its outputs")
        outs: list[Any] = []
        for i, (d, ref, share) in enumerate(zip(described, refs, shares, strict=True)):
            if not isinstance(ref, torch.Tensor):
                outs.append(None)
                continue
            checked = _described(i, d, ref)
            if isinstance(checked, Verdict):
                return checked
            _address, shape, stride, where = checked
            if not str(where).startswith("cuda"):
                return Verdict(Outcome.mismatch, f"output {i} is on {where}, expected {self.device}")
            if ref.numel() == 0:
                outs.append(torch.empty(ref.shape, dtype=ref.dtype, device=self.device))
                continue
            if share is None:
                return Verdict(Outcome.rejected, (f"output {i} is not in a device allocation of the candidate's own "
                                                  "(an input's memory, or memory that cannot be shared)"))
            try:
                outs.append(device_share.read_shared(share, ref.dtype, list(shape), list(stride), self.device))
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
            if not torch.equal(now, was) and not (now.dtype.is_floating_point and torch.equal(now.isnan(), was.isnan())
                                                  and torch.equal(now.nan_to_num(), was.nan_to_num())):
                return i
        return None

    # -- checks -----------------------------------------------------------------------------------

    def reference(self, variant: Variant, inputs: list[Any]) -> tuple[list[Any], list[Any] | None]:
        with torch.no_grad():
            refs = as_tensor_list(variant.reference(*_clone(inputs)))
        return refs, float64_reference(variant.reference, inputs)

    def check_call(
        self, variant: Variant, slot: int, inputs: list[Any], described: list[list[Any]], call_index: int,
        refs: list[Any], ref64: list[Any] | None,
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


def _described(i: int, d: Any, ref: torch.Tensor) -> Verdict | tuple[int, list[int], list[int], str]:
    """The runner's description of output ``i`` checked against the reference's:
    ``(address, shape, stride, device)``, or the Verdict that it fails."""
    if not isinstance(d, list) or not d or d[0] != "tensor" or len(d) != 6:
        kind = d[1] if isinstance(d, list) and len(d) > 1 else "value"
        return Verdict(Outcome.rejected, f"output {i} is a {kind}, not a plain torch.Tensor")
    _, address, dtype, shape, stride, where = d
    if dtype not in DTYPES or not _ints(shape) or not _ints(stride) or not isinstance(address, int):
        return Verdict(Outcome.rejected, f"output {i}: malformed description")
    if list(shape) != list(ref.shape):
        return Verdict(Outcome.wrong_shape, f"output {i} has shape {list(shape)}, expected {list(ref.shape)}")
    if DTYPES[dtype] != ref.dtype:
        return Verdict(Outcome.mismatch, f"output {i} has dtype {dtype}, expected {str(ref.dtype).removeprefix('torch.')}")
    if ref.numel() and any(st < 0 for st in stride):
        return Verdict(Outcome.rejected, f"output {i} has negative strides")
    return address, list(shape), list(stride), str(where)


def _ints(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _aliases(ref: torch.Tensor) -> bool:
    """Whether the reference's own output shares memory with an input (then aliasing is honest)."""
    return bool(getattr(ref, "_kf_aliases_input", False))


def _strict_fp32() -> None:
    """fp32 means fp32: no TF32 in the reference's matmuls or cuDNN convolutions."""
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _fork_runner(job: EvalJob, deadline: float) -> RunnerHandle:
    from kfoundry.core.evaluation.runner import runner_main

    own_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY)
    separate = confine.new_pid_namespace()
    judge_end, runner_end = channel_pair()
    pid = os.fork()
    if pid == 0:  # the runner: never returns
        judge_end.close()
        os.close(own_namespace)
        runner_main(runner_end, job)
    runner_end.close()
    if separate:  # back to our own namespace for later children: a process whose children would land
        # in another PID namespace cannot start threads (torch's OpenMP pool would fail)
        _setns(own_namespace)
    os.close(own_namespace)
    return RunnerHandle(pid, judge_end, deadline, job.evaluation.timeout_s)


def _limit_variants(plan: TrialPlan, keep: int) -> TrialPlan:
    """The plan with at most ``keep`` shape sets besides the problem's own (and their trials)."""
    if len(plan.variants) <= keep + 1:
        return plan
    structured = [s for s in plan.structured if s.variant <= keep]
    reason = plan.fixed_shape_reason or ("other shapes not tried (evaluation.shape_variants = 0)" if keep == 0 else None)
    return TrialPlan(plan.variants[: keep + 1], reason, structured)


def _setns(fd: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0x20000000) != 0:  # CLONE_NEWPID
        raise OSError(ctypes.get_errno(), "setns back to the judge's PID namespace failed")


def _variant_label(problem: Problem, base: Problem) -> str:
    changed = {k: v for k, v in problem.shapes.items() if base.shapes.get(k) != v}
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "the problem's shapes"


def _start(job: EvalJob, runner: RunnerHandle, plan: TrialPlan) -> tuple[Judge, dict[str, Any]]:
    """Load the problem variants, tell the runner to build, wait until it has."""
    problems = [load_problem(job.problem_path, shapes) for shapes in plan.variants]
    # a uid no other live job's runner has (from its host pid), outside the usual user range
    runner.chan.send({"variants": plan.variants, "uid": 3_000_000 + runner.pid % 1_000_000})
    ready = runner.receive()
    if ready.get("op") != "ready":
        raise JobFailed(JobResult(outcome=Outcome.runtime_error, message=f"setup: {ready.get('error', 'runner did not start')}",
                                  log=str(ready.get("log", ""))))
    device = str(ready.get("torch_device", "cpu"))
    runner.freeze()
    ipc = ready.get("ipc") is True and device.startswith("cuda") and device_share.available()
    probe = device_share.IdleProbe(device) if ipc else None
    if probe is not None:
        probe.calibrate()
    exchange_ms = _calibrate(runner, device, probe) if device != "cpu" else None
    per_call_ms = _calibrate_calls(runner, probe) if device != "cpu" else None
    built, _ = runner.exchange({"op": "build"})  # candidate code runs from here on: nothing it says is trusted
    variants = []
    for i, problem in enumerate(problems):
        reference = problem.make_reference().to(device)
        variants.append(Variant(i, problem, reference, _variant_label(problem, problems[0])))
    judge = Judge(job, runner, device, variants)
    judge.exchange_ms = exchange_ms
    if probe is not None:
        judge.probe, judge.shared = probe, device_share.JudgeBuffers(device)
        judge.log.append(f"CUDA IPC: the judge owns the inputs and reads the outputs; idle probe {probe.idle_s * 1e6:.0f} us")
    elif device != "cpu":
        judge.log.append("no CUDA IPC here: the runner stages inputs and copies outputs off the device (less isolation)")
    overhead = ready.get("timer_overhead_ms")
    judge.timer_overhead_ms = float(overhead) if isinstance(overhead, (int, float)) and 0 <= overhead < 50 else None
    if per_call_ms is not None:
        judge.log.append(f"per-call overhead on the judge's clock {per_call_ms:.4f} ms (the runner's own: {overhead})")
        judge.timer_overhead_ms = per_call_ms
    raw_in_force = ready.get("in_force")
    in_force: dict[Any, Any] = raw_in_force if isinstance(raw_in_force, dict) else {}
    judge.sandbox = {str(k): bool(v) for k, v in in_force.items()}
    judge.sandbox_notes = [str(n)[:300] for n in (ready.get("notes") or [])][:20]
    missing = [k for k, v in judge.sandbox.items() if not v]
    if missing:
        judge.log.append("sandbox protections not in force: " + ", ".join(missing) + "; " + "; ".join(ready.get("notes") or []))
    if built.get("ok") is not True:
        raise JobFailed(judge._error_result(built, "build"))
    for note in built.get("notes") or []:
        idx = _variant_index(str(note))
        if idx is not None and 0 < idx < len(variants):
            variants[idx].ok = False
        judge.log.append(f"shape variant skipped (the candidate does not build there): {str(note)[:300]}")
    return judge, built


def _calibrate(runner: RunnerHandle, device: str, probe: device_share.IdleProbe | None, rounds: int = 9) -> float | None:
    """What one clocked exchange of one device-timed empty call costs beyond its events (ms), measured
    before any candidate code has run in the runner (so nothing can inflate it).

    Before each exchange the judge uses the device itself, as it does between timed batches (drawing
    and copying inputs), so the GPU's switch from the judge's context to the runner's is counted; the
    exchange ends as timed ones do (with the idle probe, where there is one).
    """
    extra: list[float] = []
    settle = probe.wait_idle if probe is not None else None
    for _ in range(rounds):
        torch.rand(1 << 20, device=device).cpu()
        reply, ns = runner.exchange({"op": "calibrate"}, settle=settle)
        events = reply.get("device_ms")
        if not isinstance(events, list) or len(events) != 1 or not isinstance(events[0], (int, float)):
            return None
        extra.append(ns / 1e6 - float(events[0]))
    return sorted(extra)[len(extra) // 2]


def _calibrate_calls(runner: RunnerHandle, probe: device_share.IdleProbe | None, calls: int = 8,
                     rounds: int = 5) -> float | None:
    """What one timed call costs on the judge's clock beyond its device events, on the runner's real call
    path with a trusted forward (an output allocation and a no-op launch), before any candidate code
    runs: the difference of exchanges of ``calls`` and ``2 * calls`` calls, so no fixed cost is in it.
    None where the runner has no trusted forward (the runner's own figure is used then)."""
    settle = probe.wait_idle if probe is not None else None
    samples: list[float] = []
    for _ in range(rounds):
        measured = []
        for n in (calls, 2 * calls):
            reply, ns = runner.exchange({"op": "calibrate", "calls": n}, settle=settle)
            events = _event_samples(reply.get("device_ms"), n) if reply.get("ok") is True else []
            if not events:
                return None
            measured.append((ns / 1e6, sum(events)))
        (t1, e1), (t2, e2) = measured
        samples.append((t2 - t1 - (e2 - e1)) / calls)
    return max(0.0, sorted(samples)[len(samples) // 2])


def _variant_index(note: str) -> int | None:
    head = note.split(":", 1)[0].removeprefix("variant ").strip()
    return int(head) if head.isdigit() else None


# -- correctness --------------------------------------------------------------------------------


@dataclass
class Trial:
    variant: int
    distribution: str
    aligned: bool
    label: str


def _trial_list(job: EvalJob, plan: TrialPlan) -> list[Trial]:
    base = [Trial(0, "problem", True, f"trial {i}") for i in range(job.evaluation.trials)]
    structured = [Trial(s.variant, s.distribution, s.aligned, s.label or _spec_label(s)) for s in plan.structured]
    return base + structured


def _spec_label(spec: TrialSpec) -> str:
    return f"variant {spec.variant}, {spec.distribution} inputs" + ("" if spec.aligned else ", unaligned")


def _correctness(judge: Judge, plan: TrialPlan) -> str:
    """Every correctness trial; raises JobFailed at the first failure; returns a summary line."""
    ev = judge.job.evaluation
    trials = _trial_list(judge.job, plan)
    sizes: dict[tuple[int, bool], int] = {}
    sample_inputs: dict[int, list[Any]] = {}
    for v in judge.variants:
        sample_inputs[v.index] = v.problem.make_inputs(0, judge.device)
    for t in trials:
        key = (t.variant, t.aligned)
        sizes[key] = _nbytes(sample_inputs[t.variant]) + 64 * (len(sample_inputs[t.variant]) + 1)
    judge.open_arena(sum(sizes.values()) + 4096)
    generator = torch.Generator().manual_seed(secrets.randbits(63))
    seeds: list[int] = []
    first: dict[int, tuple[list[Any], list[Any]]] = {}
    counts = {"trials": 0, "skipped": 0}
    kinds: set[str] = set()
    started = time.monotonic()
    extra = 0
    index = 0
    while True:
        if index < len(trials):
            trial = trials[index]
        elif extra < ev.max_trials - len(trials) and time.monotonic() - started < ev.correctness_budget_s:
            trial = Trial(0, "problem", True, f"extra trial {extra}")
            extra += 1
        else:
            break
        index += 1
        variant = judge.variants[trial.variant]
        if not variant.ok:
            continue
        seed = secrets.randbits(31)
        seeds.append(seed)
        inputs = variant.problem.make_inputs(seed, judge.device)
        inputs = transform_inputs(inputs, trial.distribution, generator)
        refs, ref64 = judge.reference(variant, inputs)
        _mark_aliasing(refs, inputs)
        if trial.distribution not in ("problem", "nonfinite"):
            reason = domain_reason(refs, ref64)
            if reason is not None:
                counts["skipped"] += 1
                judge.log.append(f"{trial.label}: skipped ({reason})")
                continue
        key = (trial.variant, trial.aligned)
        if key not in judge.slot_keys:
            judge.slot_keys[key] = judge.add_slots([inputs], trial.aligned)[0]
        slot = judge.slot_keys[key]
        judge.write([slot], [inputs])
        where = f"{trial.label} ({variant.label})" if trial.variant else trial.label
        described, _, _ = judge.call(trial.variant, [slot], where, judge.device != "cpu")
        outs, verdict = judge.check_call(variant, slot, inputs, described[0], 0, refs, ref64)
        if verdict is not None:
            judge.log.insert(0, f"trial input seeds: {seeds}")
            raise JobFailed(JobResult(outcome=verdict.outcome, message=f"{where}: {verdict.message}"))
        counts["trials"] += 1
        if counts["trials"] == 1:  # the budget for extra trials starts once the kernels are compiled
            started = time.monotonic()
        kinds.add(trial.distribution + ("" if trial.aligned else " unaligned"))
        if trial.distribution == "problem" and outs is not None:
            if trial.variant not in first:
                first[trial.variant] = (outs, refs)
            else:
                verdict = check_independence([first[trial.variant][0], outs], [first[trial.variant][1], refs])
                if verdict is not None:
                    raise JobFailed(JobResult(outcome=verdict.outcome, message=f"{where}: {verdict.message}"))
    judge.log.insert(0, f"trial input seeds: {seeds}")
    shapes = [v.label for v in judge.variants if v.ok]
    if plan.fixed_shape_reason:
        judge.log.append(f"no other shapes tried: {plan.fixed_shape_reason}")
    fixed = f", fixed: {plan.fixed_shape_reason}" if plan.fixed_shape_reason else ""
    return (f"correct on {counts['trials']} trials ({len(shapes)} shape set{'s' if len(shapes) != 1 else ''}{fixed}; "
            f"inputs: {', '.join(sorted(kinds))})")


def _mark_aliasing(refs: list[Any], inputs: list[Any]) -> None:
    storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    for r in refs:
        if isinstance(r, torch.Tensor) and r.numel() and r.untyped_storage().data_ptr() in storages:
            r._kf_aliases_input = True  # type: ignore[attr-defined]


# -- timing ---------------------------------------------------------------------------------------


def _timing(judge: Judge, verify: bool) -> tuple[TimingStats, int, int]:
    """Batches of calls on distinct fresh inputs, clocked by the judge: (stats, calls, verified calls)."""
    ev = judge.job.evaluation
    variant = judge.variants[0]
    sample = variant.problem.make_inputs(secrets.randbits(31), judge.device)
    per_set = max(1, _nbytes(sample))
    capacity_sets = int(max(1, min(MAX_BATCH, max(ev.rotate_bytes, per_set) // per_set)))
    if judge.shared is not None:
        # on a GPU a batch must be long enough for the judge's clock to matter: up to DEVICE_ROTATE_SHARE
        # of the free device memory (at most DEVICE_ROTATE_MAX) in distinct input sets
        free, _total = torch.cuda.mem_get_info()
        capacity_sets = int(max(capacity_sets, min(MAX_BATCH, min(DEVICE_ROTATE_MAX, free * DEVICE_ROTATE_SHARE) // per_set)))
    judge.open_arena(4096 if judge.shared is not None else capacity_sets * (per_set + 64 * (len(sample) + 1)) + 4096)
    slots = judge.add_slots([sample])
    current = [sample]
    rng = secrets.SystemRandom()

    def refill(ids: list[int]) -> list[list[Any]]:
        sets = [variant.problem.make_inputs(secrets.randbits(31), judge.device) for _ in ids]
        judge.write(ids, sets)
        return sets

    # warm-up, one call at a time, fresh inputs each call
    warm: list[float] = []
    drawing: list[float] = []
    start = time.monotonic()
    while len(warm) < 2 or time.monotonic() - start < ev.warmup_s:
        t0 = time.monotonic()
        current = refill(slots[:1])
        drawing.append(time.monotonic() - t0)
        # sized from the whole exchange: on a GPU, batches of many more calls carry more of the
        # forward's own host work than the margin allows (measured, benchmarks/NOTES.md)
        _, ns, _ = judge.call(0, slots[:1], "warm-up", judge.device != "cpu")
        warm.append(ns / 1e9)
    per_call = sorted(warm)[len(warm) // 2]
    per_draw = sorted(drawing)[len(drawing) // 2]
    differential = judge.job.timing_method == "differential"
    batch = int(min(capacity_sets, max(1, -(-ev.batch_time_s // max(per_call, 1e-9)))))
    # batches of b and 2b calls: the difference of the judge's clock over them has no fixed cost in it
    # (the independent method; on a device also the judge's check on the device events)
    device_clock = judge.device != "cpu" and judge.timer_overhead_ms is not None and judge.exchange_ms is not None
    paired = (differential or device_clock) and capacity_sets >= 2
    if paired:
        batch = max(2, batch - batch % 2)
    if batch > len(slots):
        more = [variant.problem.make_inputs(secrets.randbits(31), judge.device) for _ in range(batch - len(slots))]
        slots += judge.add_slots(more)
    slots = slots[:batch]
    repeats = int(min(ev.max_repeats, max(ev.min_repeats, -(-ev.target_time_s // max(per_call * batch, 1e-9)))))
    # Fresh inputs for every call can cost more than the calls (a vector add draws its inputs slower than
    # it adds them): drawing gets at most twice the measuring time, never fewer than min_repeats batches.
    affordable = int(2 * ev.target_time_s // max(per_draw * batch, 1e-9))
    repeats = max(ev.min_repeats, min(repeats, affordable))
    samples: list[float] = []
    verified = 0
    calls = 0
    chance = min(1.0, ev.verified_batches / repeats)
    device_timing = judge.device != "cpu"
    events: list[float] = []
    for r in range(repeats):
        if paired:
            half = batch // 2
            current = refill(slots[:half])
            _, small_ns, small_reply = judge.call(0, slots[:half], "while timed", device_timing)
            calls += half
            events += _event_samples(small_reply.get("device_ms"), half)
        current = refill(slots)
        described, ns, reply = judge.call(0, slots, "while timed", device_timing)
        if paired:
            overhead = judge.timer_overhead_ms if device_timing and judge.timer_overhead_ms is not None else 0.0
            samples.append(max((ns - small_ns) / 1e6 / (batch - half) - overhead, 1e-6))
            events += _event_samples(reply.get("device_ms"), batch)
        else:
            samples.append(_per_call_ms(ns / 1e6, batch, reply.get("device_ms"), judge))
        calls += batch
        # the final batch always (work left running past its answer is caught), others at random
        if not verify or (r < repeats - 1 and rng.random() >= chance):
            continue
        picks = {batch - 1} | set(rng.sample(range(batch), min(ev.verify_per_batch, batch)))
        for k in sorted(picks):
            refs, ref64 = judge.reference(variant, current[k])
            _mark_aliasing(refs, current[k])
            _, verdict = judge.check_call(variant, slots[k], current[k], described[k], k, refs, ref64)
            verified += 1
            if verdict is not None:
                raise JobFailed(JobResult(outcome=Outcome.rejected, message=(
                    f"wrong while timed (call {k + 1} of batch {r + 1}; results cached, work skipped or left "
                    f"running): {verdict.message}")))
    if paired and not differential:
        samples = _device_or_judge(judge, events, samples)
    return summarize(samples), calls, verified


def _event_samples(device_ms: Any, calls: int) -> list[float]:
    """Per-call device times of one batch (none if the runner's answer is not a list of ``calls`` numbers)."""
    if not isinstance(device_ms, list) or len(device_ms) != calls:
        return []
    if not all(isinstance(x, (int, float)) and 0 < x < 1e6 for x in device_ms):
        return []
    return [float(x) for x in device_ms]


def _device_or_judge(judge: Judge, events: list[float], clocked: list[float]) -> list[float]:
    """The device events' per-call times, if the judge's differential clock agrees with them, else its own.

    ``clocked`` are the judge's per-call times from pairs of batches of b and 2b calls (their difference:
    no exchange or other fixed cost in it, the device timer's calibrated per-call overhead removed). The
    events count when the median of ``clocked`` exceeds theirs by at most :data:`DEVICE_SHARE` and
    :data:`DEVICE_PER_CALL_MS`; work the events do not see (another stream, faked events) beyond that
    is on the judge's clock and makes the judge's times count.
    """
    if not events:
        judge.log.append("device events unusable: the judge's differential clock counted")
        return clocked
    ev_median = sorted(events)[len(events) // 2]
    clock_median = sorted(clocked)[len(clocked) // 2]
    judge.log.append(f"judge's differential clock {clock_median:.4f} ms per call against device events "
                     f"{ev_median:.4f} ms ({len(clocked)} batch pairs, {len(events)} events)")
    if clock_median > ev_median * (1 + DEVICE_SHARE) + DEVICE_PER_CALL_MS:
        judge.clock_disagreements += 1
        judge.disagreement_samples.append(f"differential {clock_median:.4f} ms, events {ev_median:.4f} ms per call")
        return clocked
    return events


#: The device events count when the judge's own clock per call (the difference of batches of b and 2b
#: calls, less the per-call overhead of a trusted forward measured the same way before candidate code
#: ran) exceeds them by no more than this share plus this much per call; beyond that the judge's clock
#: counts. On the H200 (benchmarks/NOTES.md, calls 4-7) honest kernels read up to ~0.24 ms per call
#: above their events on that clock in some jobs (host work of the forward and exchange jitter the
#: calibration does not hold), so this is the bound on work a candidate can hide from the events.
DEVICE_SHARE = 0.25
DEVICE_PER_CALL_MS = 0.25
#: Where no pairs of batches fit (one input set per batch), per batch on top of the per-call margin.
DEVICE_PER_BATCH_MS = 0.5


def _per_call_ms(wall_ms: float, batch: int, device_ms: Any, judge: Judge) -> float:
    """One timing sample (ms per call) from one batch.

    Without calibration (the CPU) it is the judge's clock over the batch. On a device it is the device
    events, unless the judge's clock less what the same exchange cost with an empty call and the device
    timer's own per-call overhead (both measured before any candidate code ran, so the candidate cannot
    inflate them) says more than the bounded margin above; then the judge's clock counts. Faked small
    events lose to the judge's clock, and work on another stream or left queued is on the judge's clock
    (the exchange ends only once the GPU is idle); what can hide is bounded by the margin.
    """
    host = wall_ms / batch
    overhead, exchange = judge.timer_overhead_ms, judge.exchange_ms
    if overhead is None or exchange is None:
        return host
    charged = max(wall_ms - exchange - (batch - 1) * overhead, 1e-6)
    events = None
    if isinstance(device_ms, list) and len(device_ms) == batch and all(isinstance(x, (int, float)) for x in device_ms):
        events = float(sum(device_ms))
    if events is None or not 0 < events <= wall_ms:
        judge.clock_disagreements += 1
        if len(judge.disagreement_samples) < 3:
            judge.disagreement_samples.append(f"{batch} calls: judge {wall_ms:.3f} ms, events unusable")
        return charged / batch
    judge.clock_pairs.append((events, charged))
    if charged > events * (1 + DEVICE_SHARE) + DEVICE_PER_CALL_MS * batch + DEVICE_PER_BATCH_MS:
        judge.clock_disagreements += 1
        if len(judge.disagreement_samples) < 3:
            judge.disagreement_samples.append(f"{batch} calls: judge {charged:.3f} ms net of overheads, "
                                              f"events {events:.3f} ms, runner says {judge.last_phases} ms")
        return charged / batch
    return events / batch


# -- the job ------------------------------------------------------------------------------------


def execute(job: EvalJob, runner_pid_file: str | None = None) -> JobResult:
    """Run one job: fork the runner, judge it, return the result (the sandbox calls this in a child).

    A job that carries its problem's text (``problem_source``) is run on a private copy of it.
    """
    if job.problem_source is None:
        return _execute(job, runner_pid_file)
    folder = tempfile.mkdtemp(prefix="kf-problem-")
    try:
        path = os.path.join(folder, os.path.basename(job.problem_path) or "problem.py")
        with open(path, "w") as handle:
            handle.write(job.problem_source)
        os.chmod(path, 0o444)  # the runner reads it after it changed its uid (the confinement binds it)
        os.chmod(folder, 0o755)
        return _execute(job.model_copy(update={"problem_path": path, "problem_source": None}), runner_pid_file)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _execute(job: EvalJob, runner_pid_file: str | None = None) -> JobResult:
    start = _clock_ns()
    deadline = time.monotonic() + job.evaluation.timeout_s
    _strict_fp32()
    runner = _fork_runner(job, deadline)
    if runner_pid_file:
        with contextlib.suppress(OSError), open(runner_pid_file, "w") as handle:
            handle.write(str(runner.pid))
    judge: Judge | None = None
    built: dict[str, Any] = {}
    try:
        try:
            problem = load_problem(job.problem_path, job.shapes)
            plan = plan_trials(problem) if job.kind == "evaluate" else TrialPlan([dict(problem.shapes)], None, [])
            plan = _limit_variants(plan, job.evaluation.shape_variants)
        except KfError as exc:
            return JobResult(outcome=Outcome.runtime_error, message=f"setup: {exc}")
        judge, built = _start(job, runner, plan)
        judge.check_native("after build")
        compile_s = float(built.get("compile_s") or 0.0)
        judge.phase("start and build")
        if job.kind == "reference":
            with _device_lock(job.lock_path):
                timing, calls, _ = _timing(judge, verify=False)
            judge.phase("timing")
            result = JobResult(outcome=Outcome.correct, message="reference timed", timing=timing)
        else:
            summary = _correctness(judge, plan)
            judge.check_native("after the correctness trials")
            judge.phase("correctness")
            with _device_lock(job.lock_path):
                timing, calls, verified = _timing(judge, verify=True)
            judge.check_native("after timing")
            judge.phase("timing")
            result = JobResult(outcome=Outcome.correct, timing=timing, compile_time_s=compile_s,
                               message=f"{summary}; {calls} timed calls on fresh inputs, {verified} of them verified")
    except JobFailed as failed:
        result = failed.result
        if built.get("ok"):
            result.compile_time_s = float(built.get("compile_s") or 0.0)
    except Exception as exc:
        import traceback

        result = JobResult(outcome=Outcome.runtime_error, message=f"judge: {type(exc).__name__}: {exc}",
                           log=traceback.format_exc()[-4000:])
    finally:
        runner.kill()
        if judge is not None and judge.arena is not None:
            judge.arena.close()
        if judge is not None and judge.shared is not None:
            with contextlib.suppress(Exception):
                judge.shared.close()
    if judge is not None:
        result.sandbox, result.sandbox_notes = judge.sandbox, judge.sandbox_notes
    if isinstance(built.get("resources"), dict):
        result.resources = built["resources"]
    if judge is not None and judge.clock_disagreements:
        judge.log.append(f"device clock undercut the judge's clock in {judge.clock_disagreements} timed batches: "
                         "the judge's clock counted there (" + "; ".join(judge.disagreement_samples)
                         + f"; exchange overhead {judge.exchange_ms} ms, timer overhead {judge.timer_overhead_ms} ms)")
    if judge is not None and judge.clock_pairs:
        ratios = sorted(c / e for e, c in judge.clock_pairs)
        judge.log.append(f"judge's clock net of overheads / device events over {len(ratios)} batches: median "
                         f"{ratios[len(ratios) // 2]:.4f}, range {ratios[0]:.4f}-{ratios[-1]:.4f}")
    if judge is not None and judge.phases:
        judge.log.append("judge phases: " + ", ".join(f"{name} {secs:.2f} s" for name, secs in judge.phases))
    parts = ([*judge.log] if judge else []) + ([str(built.get("log"))] if built.get("log") else []) + ([result.log] if result.log else [])
    result.log = "\n".join(p for p in parts if p)[-12000:]
    result.wall_s = (_clock_ns() - start) / 1e9
    return result
