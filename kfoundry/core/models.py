"""Typed objects that flow between the pieces of kfoundry (see docs/architecture.md).

Every arrow in the data flow carries one of these, never a loose dict.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

ParamValue = int | float | str | bool
#: A kernel language's name: any language a plugin registered (:mod:`kfoundry.core.languages`), checked
#: against the registry where a candidate enters (``kf-run eval``, task files, the evaluator).
Language = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_+-]{0,31}$")]
#: The language of the default backend (``backend.name = "opencl"``), where a candidate names none.
DEFAULT_LANGUAGE = "opencl"


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def stable_hash(*parts: Any) -> str:
    """A short, stable content hash of JSON-serialisable parts."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


class Outcome(str, Enum):
    """The verdict of one evaluation; each failure names the stage that failed."""

    parse_error = "parse_error"  # the generator's response held no usable code
    compile_error = "compile_error"
    runtime_error = "runtime_error"
    timeout = "timeout"
    wrong_shape = "wrong_shape"
    mismatch = "mismatch"
    rejected = "rejected"  # anti-cheat: static check, input mutation, constant output, ...
    correct = "correct"

    @property
    def stage_score(self) -> int:
        """0-5 stage score as in the published KernelFoundry (5 = correct)."""
        return _STAGE_SCORE[self]


_STAGE_SCORE = {
    Outcome.parse_error: 0,
    Outcome.rejected: 1,
    Outcome.compile_error: 1,
    Outcome.runtime_error: 2,
    Outcome.timeout: 2,
    Outcome.wrong_shape: 3,
    Outcome.mismatch: 4,
    Outcome.correct: 5,
}


class DeviceProfile(BaseModel):
    """What a search and a prompt need to know about one device. Unknown fields stay None."""

    model_config = ConfigDict(extra="forbid")

    backend: str
    name: str
    index: int = 0
    vendor: str = ""
    device_type: Literal["cpu", "gpu", "accelerator", "other"] = "other"
    driver_version: str = ""
    compute_units: int | None = None
    max_work_group_size: int | None = None
    max_work_item_sizes: list[int] | None = None
    local_mem_bytes: int | None = None
    global_mem_bytes: int | None = None
    warp_size: int | None = None
    sub_group_sizes: list[int] | None = None
    preferred_vector_width_float: int | None = None
    compute_capability: str | None = None
    shared_mem_per_block: int | None = None
    shared_mem_per_sm: int | None = None
    registers_per_block: int | None = None
    registers_per_sm: int | None = None
    l2_cache_bytes: int | None = None
    clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    #: Peak memory bandwidth (bytes read + written per second), from a table or measured.
    peak_bandwidth_gbs: float | None = None
    #: Peak fp32 arithmetic rate.
    peak_gflops: float | None = None
    peaks_measured: bool = False
    extra: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        """Identifies the device in caches and stores."""
        return f"{self.backend}:{self.name}"


class TunableSpace(BaseModel):
    """Template parameters: name -> ordered allowed values, plus restrictions as expressions."""

    model_config = ConfigDict(extra="forbid")

    params: dict[str, list[ParamValue]] = Field(default_factory=dict)
    #: Python expressions over the parameter names (and ``device``), e.g. ``"BLOCK_X * BLOCK_Y <= 1024"``.
    restrictions: list[str] = Field(default_factory=list)


class Candidate(BaseModel):
    """A proposed kernel: source, language, template parameter values and provenance."""

    model_config = ConfigDict(extra="forbid")

    source: str
    language: Language = DEFAULT_LANGUAGE
    #: ``kernelbench``: Python source defining ``ModelNew``; ``native``: raw kernel source.
    kind: Literal["kernelbench", "native"] = "kernelbench"
    params: dict[str, ParamValue] = Field(default_factory=dict)
    space: TunableSpace | None = None
    parent_id: str | None = None
    generator: str = "user"
    prompt_id: str | None = None
    label: str = ""
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def content_hash(self) -> str:
        """Hash of what determines behaviour: source, language, kind and parameter values."""
        return stable_hash(self.source, self.language, self.kind, self.params)

    def with_params(self, params: dict[str, ParamValue]) -> Candidate:
        """A copy of this candidate with other template parameter values."""
        return self.model_copy(update={"params": dict(params)})


class TimingStats(BaseModel):
    """Robust timing summary of repeated runs, in milliseconds."""

    median_ms: float
    iqr_ms: float
    ci95_low_ms: float
    ci95_high_ms: float
    mean_ms: float
    min_ms: float
    n: int
    n_outliers: int = 0
    times_ms: list[float] = Field(default_factory=list)

    @property
    def spread(self) -> float:
        """Relative spread: IQR over median."""
        return self.iqr_ms / self.median_ms if self.median_ms else float("nan")


class EvalRecord(BaseModel):
    """The verdict, timing and logs of one evaluation of one candidate on one device."""

    candidate_hash: str
    eval_key: str
    problem: str
    backend: str
    device: str
    toolchain: str = ""
    outcome: Outcome
    message: str = ""
    log: str = ""
    timing: TimingStats | None = None
    reference_timing: TimingStats | None = None
    speedup: float | None = None
    #: Fraction of the roofline (speed of light) reached: bound time / measured time.
    roofline_fraction: float | None = None
    roofline_flag: bool = False
    compile_time_s: float | None = None
    resources: dict[str, Any] = Field(default_factory=dict)
    descriptors: dict[str, float] = Field(default_factory=dict)
    cached: bool = False
    created_at: datetime = Field(default_factory=_utcnow)

    @property
    def is_correct(self) -> bool:
        return self.outcome is Outcome.correct

    @property
    def fitness(self) -> float:
        """Stage score plus speedup (correct kernels only), as in the published KernelFoundry."""
        bonus = (self.speedup or 0.0) if self.is_correct else 0.0
        return self.outcome.stage_score + bonus


class Proposal(BaseModel):
    """What a generator returns: a candidate plus how it came to be."""

    candidate: Candidate | None = None
    generator: str
    rationale: str = ""
    #: Set when the response could not be turned into a candidate (becomes a parse_error outcome).
    parse_error: str | None = None
    prompt_id: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0


class ArchiveCell(BaseModel):
    """One cell of the quality-diversity archive: its coordinates and its elite."""

    coords: tuple[int, ...]
    island: int = 0
    candidate: Candidate
    record: EvalRecord
    migrated: bool = False


class TuningResult(BaseModel):
    """The outcome of tuning one candidate's template parameters."""

    best_params: dict[str, ParamValue] | None
    best_time_ms: float | None
    evaluations: int
    invalid: int = 0
    trials: list[dict[str, Any]] = Field(default_factory=list)
    tuner: str
