"""The tuner contract (ask/tell) and the driver that runs a tuner within one shared budget.

A :class:`Tuner` proposes configurations (``ask``) and learns their measured objective (``tell``;
``None`` means invalid: a compile or launch failure, a wrong result, never "slow"). The driver,
:func:`run_tuner`, owns everything a tuner must not get wrong:

- the budget: unique evaluations (never overrun) and wall time (an evaluation is not started when,
  at the average pace so far, it would end past the deadline);
- the tabu list: a configuration is measured at most once (a repeat ask is answered from memory);
- the space: a configuration outside the restrictions or device limits is never evaluated (the
  tuner is told it is invalid at no cost);
- seeding: known-good configurations are evaluated first, in order.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kfoundry.core.errors import KfError
from kfoundry.core.space import Config, ConfigKey, ParamSpace

Invalidity = Literal["correct", "compile", "runtime", "correctness", "timeout", "constraints"]

#: After this many asks in a row that yield nothing new, the driver draws an unseen configuration.
MAX_STALE_ASKS = 64


class TunerError(KfError):
    """A tuner was misconfigured or misbehaved."""


@dataclass(frozen=True)
class Measurement:
    """What one evaluation of one configuration gave: the objective (lower is better) or why not."""

    value: float | None
    invalidity: Invalidity = "correct"
    message: str = ""
    times: list[float] = field(default_factory=list)
    compile_time_ms: float | None = None

    @property
    def valid(self) -> bool:
        return self.value is not None and math.isfinite(self.value)


@dataclass(frozen=True)
class Trial:
    """One evaluated configuration, in evaluation order."""

    index: int
    config: Config
    measurement: Measurement
    elapsed_s: float
    seeded: bool = False

    @property
    def value(self) -> float | None:
        return self.measurement.value if self.measurement.valid else None


class Budget(BaseModel):
    """One shared budget: unique evaluations and wall time (None: unlimited)."""

    model_config = ConfigDict(extra="forbid")

    evaluations: int | None = Field(default=None, ge=1)
    wall_time_s: float | None = Field(default=None, gt=0)


@dataclass
class TuneTrace:
    """Everything one tuning run did."""

    tuner: str
    trials: list[Trial]
    stop_reason: str
    space_size: int
    #: Asks answered without an evaluation (repeats, restriction or device-limit violations).
    skipped: int = 0

    @property
    def valid_trials(self) -> list[Trial]:
        return [t for t in self.trials if t.value is not None]

    @property
    def best(self) -> Trial | None:
        valid = self.valid_trials
        return min(valid, key=lambda t: t.value or math.inf) if valid else None

    def best_after(self, evaluations: int) -> float | None:
        """Best objective among the first ``evaluations`` trials."""
        values = [t.value for t in self.trials[:evaluations] if t.value is not None]
        return min(values) if values else None

    def evaluations_to(self, target: float) -> int | None:
        """How many evaluations it took to reach an objective ``<= target`` (None: never)."""
        for i, trial in enumerate(self.trials, 1):
            if trial.value is not None and trial.value <= target:
                return i
        return None


class Tuner(ABC):
    """An ask/tell tuner over a :class:`ParamSpace`. A factory builds a fresh one per tuning run."""

    name: ClassVar[str] = "tuner"

    def setup(self, space: ParamSpace, rng: np.random.Generator) -> None:
        """Called once before the first ``ask``."""
        self.space = space
        self.rng = rng

    @abstractmethod
    def ask(self) -> Config | None:
        """The next configuration to evaluate; None when the tuner has nothing more to propose."""

    def tell(self, config: Config, value: float | None) -> None:  # noqa: B027 - optional for blind tuners
        """The objective of ``config`` (lower is better), or None if invalid.

        Also called for configurations the tuner did not ask for (seeds, the driver's own draws) and
        for repeats (answered from memory at no cost).
        """


Objective = Callable[[Config], "Measurement | float | None"]


def _as_measurement(result: Measurement | float | None) -> Measurement:
    if isinstance(result, Measurement):
        return result
    if result is None or not math.isfinite(float(result)):
        return Measurement(None, "runtime", "objective returned no value")
    return Measurement(float(result))


def run_tuner(
    space: ParamSpace,
    objective: Objective,
    tuner: Tuner,
    budget: Budget,
    *,
    seeds: Sequence[Mapping[str, Any]] = (),
    seed: int = 0,
    on_trial: Callable[[Trial], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TuneTrace:
    """Run ``tuner`` on ``objective`` over ``space`` until the budget or the space is spent."""
    rng = np.random.default_rng(seed)
    tuner.setup(space, rng)
    start = clock()
    total = space.size
    limit = budget.evaluations
    seen: dict[ConfigKey, float | None] = {}
    trials: list[Trial] = []
    skipped = 0
    pending_seeds = [dict(s) for s in seeds]
    stale = 0

    def stop_reason() -> str | None:
        if limit is not None and len(trials) >= limit:
            return "evaluation budget spent"
        if budget.wall_time_s is not None:
            elapsed = clock() - start
            # do not start an evaluation that would, at the pace so far, end past the deadline
            pace = elapsed / len(trials) if trials else 0.0
            if elapsed + pace > budget.wall_time_s:
                return "wall-time budget spent"
        if len(seen) >= total:
            return "space exhausted"
        return None

    while (reason := stop_reason()) is None:
        seeded = bool(pending_seeds)
        if seeded:
            config = pending_seeds.pop(0)
        elif stale >= MAX_STALE_ASKS:
            config = _unseen(space, seen, rng)
        else:
            asked = tuner.ask()
            if asked is None:
                reason = "tuner finished"
                break
            config = dict(asked)
        key = space.key(config) if all(n in config for n in space.names) else None
        if key is not None and key in seen:
            skipped += 1
            stale += 1
            if not seeded:
                tuner.tell(config, seen[key])
            continue
        if key is None or not space.is_valid(config):
            skipped += 1
            stale += 1
            if not seeded:
                tuner.tell(config, None)
            continue
        stale = 0
        measurement = _as_measurement(objective(config))
        value = measurement.value if measurement.valid else None
        seen[key] = value
        trial = Trial(len(trials), config, measurement, clock() - start, seeded)
        trials.append(trial)
        tuner.tell(config, value)
        if on_trial is not None:
            on_trial(trial)
    return TuneTrace(tuner.name, trials, reason or "stopped", total, skipped)


def _unseen(space: ParamSpace, seen: Mapping[ConfigKey, Any], rng: np.random.Generator) -> Config:
    """A uniformly drawn valid configuration not evaluated yet (the space is not exhausted)."""
    keys = space.keys
    for _ in range(64):
        key = keys[int(rng.integers(len(keys)))]
        if key not in seen:
            return space.config(key)
    rest = [k for k in keys if k not in seen]
    return space.config(rest[int(rng.integers(len(rest)))])
