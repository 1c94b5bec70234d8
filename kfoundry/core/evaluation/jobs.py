"""What an executor runs: an :class:`EvalJob` in, a :class:`JobResult` out (both plain, picklable data)."""

from __future__ import annotations

import os
import re
import signal
from typing import Any, Literal

from pydantic import BaseModel, Field

from kfoundry.core.config import EvaluationConfig
from kfoundry.core.models import Candidate, DeviceProfile, Outcome, TimingStats


class EvalJob(BaseModel):
    """One sandboxed job: evaluate a candidate (``evaluate``), time the reference (``reference``), or
    compile a candidate's programs without its device (``compile``: a discovery build, see
    :mod:`~.compile_discovery`)."""

    kind: Literal["evaluate", "reference", "compile"] = "evaluate"
    problem_path: str
    #: The problem file's text, for a worker without the driver's file system: the judge writes it to
    #: a private temporary file named like ``problem_path`` and judge and runner load that one.
    problem_source: str | None = None
    shapes: dict[str, int | float] = Field(default_factory=dict)
    candidate: Candidate | None = None
    backend: str = "opencl"
    backend_options: dict[str, Any] = Field(default_factory=dict)
    #: Entry point that registers the backend: the worker loads only that plugin (None: all).
    backend_plugin: str | None = None
    device: str | int | None = None
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    #: Base of the device-lane lock: the judge locks ``lane_lock_path(job)`` (this path with the physical
    #: device's id) around correctness and timing, so one benchmark runs per device at a time and a host
    #: with several devices has one lane per device; builds stay outside it and overlap.
    lock_path: str | None = None
    #: Folder of the run's compile cache (artefacts by the hash of their compile's inputs; None: none).
    compile_cache_dir: str | None = None
    #: The device the job is for, as the driver saw it: a ``compile`` job on a machine without that
    #: device compiles for it (its compute capability is the target).
    device_profile: DeviceProfile | None = None
    #: Artefacts a ``compile`` job made for this candidate (key -> base64 of the packed artefact): the
    #: judge serves them like compile-cache entries (the same keys: inputs, toolchain and target).
    seed_artifacts: dict[str, str] = Field(default_factory=dict)
    #: ``standard``: batches clocked by the judge (device events where larger); ``differential``: the
    #: judge's clock over batches of B and 2B calls, their difference per call (no device events, no
    #: exchange calibration): the independent second measurement of a flagged kernel.
    timing_method: Literal["standard", "differential"] = "standard"
    #: Whether the backend runs on a GPU (its torch device is not the CPU): the GPU driver reserves far
    #: more virtual address space than it uses, so such jobs run without an address-space limit.
    on_gpu: bool = False
    #: CPU threads the job's judge and runner may use (None: all); the local executor sets it to the
    #: cores divided by its workers.
    threads: int | None = Field(default=None, ge=1)


class JobResult(BaseModel):
    """What a job found. ``outcome`` is ``correct`` for a successful reference timing too."""

    outcome: Outcome
    message: str = ""
    log: str = ""
    timing: TimingStats | None = None
    compile_time_s: float | None = None
    resources: dict[str, Any] = Field(default_factory=dict)
    wall_s: float = 0.0
    #: The sandbox protections and whether each was in force for this job's runner.
    sandbox: dict[str, bool] = Field(default_factory=dict)
    sandbox_notes: list[str] = Field(default_factory=list)
    #: Which clock the timing came from on a device: ``events`` (the runner's device events, confirmed
    #: by the judge's clocks) or ``judge`` (the judge's own clock: events missing or not confirmed).
    clock: Literal["events", "judge"] | None = None
    #: Wall-clock (epoch seconds) start and end of the job's phases: ``build`` (runner start and the
    #: candidate's build, outside the device lane), ``device`` (correctness and timing, in the lane) and
    #: ``lane_released_<i>`` (inside ``device``: the lane given up while the judge compiled a program);
    #: on a device also ``calibrate`` (inside ``build``: the judge calibrating its clocks, in the lane).
    phase_times: dict[str, tuple[float, float]] = Field(default_factory=dict)
    #: The kernels' programs the compile service handled: key prefix, kernels, ``cached`` (served from
    #: the compile cache; ``seeded``: shipped by the candidate's compile job) or compiled, seconds (the
    #: lookup and compile, not the wait for the lane; empty where the candidate's process compiled them
    #: itself); ``lane_released_s`` (until the lane was taken again) where the lane was given up for the
    #: compile, ``in_lane`` where it was kept.
    compiles: list[dict[str, Any]] = Field(default_factory=list)
    #: A ``compile`` job's artefacts (key -> base64 of the packed artefact), for the benchmark job's
    #: :attr:`EvalJob.seed_artifacts`.
    artifacts: dict[str, str] = Field(default_factory=dict)


def device_lane(job: EvalJob) -> str:
    """The physical device a job runs on, as a file-name-safe id: the job's device index mapped through
    ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` where set (Ray sets it per task)."""
    spec = 0 if job.device is None else job.device
    index = int(spec) if isinstance(spec, int) or str(spec).isdigit() else None
    visible = os.environ.get(_VISIBLE.get(job.backend, ""), "")
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index is not None and index < len(entries):
        lane = entries[index]
    else:
        lane = str(index if index is not None else spec)
    return re.sub(r"[^A-Za-z0-9_.-]", "_", lane)[:64]


def lane_lock_path(job: EvalJob) -> str | None:
    """The file locked around a job's correctness and timing: one per physical device (None: no lock)."""
    if not job.lock_path:
        return None
    base = job.lock_path[: -len(".lock")] if job.lock_path.endswith(".lock") else job.lock_path
    return f"{base}-dev{device_lane(job)}.lock"


_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "hip": "HIP_VISIBLE_DEVICES", "triton": "CUDA_VISIBLE_DEVICES"}


def describe_exit(status: int | None, vanished: str, unfinished: str = "") -> str:
    """How a child process ended, in words (``vanished`` when its status is unknown)."""
    if status is None:
        return vanished
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        # the memory limit is an address-space rlimit (a MemoryError, not a signal): SIGKILL comes from
        # the kernel's out-of-memory killer or from outside the sandbox, and nothing here tells which
        return f"killed by {name}" + (
            " (out of memory, or killed from outside the sandbox)" if sig == signal.SIGKILL else ""
        )
    return f"exited with status {os.WEXITSTATUS(status)}{unfinished}"
