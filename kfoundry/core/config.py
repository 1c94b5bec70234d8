"""The run configuration: its pydantic models and :func:`load_config`.

Unknown keys are errors that name their path. Reading TOML and ``--set`` overrides is in
:mod:`kfoundry.core.config_io`; finding, validating and building the plugins a config names is in
:mod:`kfoundry.core.config_plugins`. Both are re-exported here, the import path the rest uses.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kfoundry.core.config_io import (
    apply_override,
    format_validation_error,
    parse_override,
    parse_toml,
    read_toml,
    short_repr,
)
from kfoundry.core.config_plugins import (
    build_plugin,
    plugin_choices,
    plugin_options,
    resolved_config,
    validate_plugin_options,
)
from kfoundry.core.errors import ConfigError
from kfoundry.core.plugins import PluginManager, get_plugin_manager

__all__ = [
    "BackendConfig",
    "BudgetConfig",
    "EnsembleConfig",
    "EvaluationConfig",
    "ExecutorConfig",
    "LLMConfig",
    "PluginChoice",
    "ProblemConfig",
    "RunConfig",
    "SearchConfig",
    "Strict",
    "TunerConfig",
    "apply_override",
    "build_plugin",
    "format_validation_error",
    "load_config",
    "parse_override",
    "parse_toml",
    "plugin_choices",
    "plugin_options",
    "read_toml",
    "resolved_config",
    "validate_plugin_options",
]


class Strict(BaseModel):
    """Base for config sections: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PluginChoice(Strict):
    """A named plugin and its options (validated against the plugin's own options model)."""

    name: str = Field(description="Registered plugin name (see `kf-run plugins`).")
    options: dict[str, Any] = Field(
        default_factory=dict, description="The plugin's own options (see Plugin options below)."
    )


class BackendConfig(PluginChoice):
    name: str = "opencl"
    device: str | int | None = Field(
        default=None,
        description="Device by index or by a case-insensitive substring of its name; None: the first device.",
    )


class LLMConfig(PluginChoice):
    name: str = "offline"
    weight: float = Field(
        default=1.0, gt=0, description="Relative weight in ``sample`` mode and prior in ``bandit`` mode."
    )
    model: str | None = Field(
        default=None, description="Model name for LLM providers (ignored by the offline generator)."
    )


class EnsembleConfig(Strict):
    mode: Literal["sample", "bandit", "vote"] = Field(
        default="sample", description="sample: weighted choice; bandit: UCB on gain per cost; vote: Borda."
    )
    keep: int = Field(
        default=2, ge=1, description="How many proposals the vote keeps for evaluation (vote mode)."
    )
    meta_every: int = Field(
        default=3, ge=0, description="Rewrite one evolvable prompt section every N generations (0: never)."
    )
    meta_llm: int = Field(
        default=0, ge=0, description="Index into ``llms`` of the model that rewrites prompts."
    )
    novelty: bool = Field(
        default=True, description="Drop proposals identical (ignoring whitespace, comments) to earlier ones."
    )


class SearchConfig(PluginChoice):
    name: str = "map_elites"


class TunerConfig(PluginChoice):
    name: str = "bayesian"
    every: int = Field(
        default=0, description="Tune the elites every N generations (0: only at the end; -1: never)."
    )
    evaluations: int = Field(
        default=30, ge=1, description="Unique configurations evaluated per tuning of one kernel."
    )
    elites: int = Field(default=2, ge=1, description="How many elites are tuned each time.")
    warm_start: list[str] = Field(
        default_factory=list,
        description="Earlier tuning results to warm-start from: run folders, stores, Kernel Tuner cache files,"
        " or directories of them (a performance database; this run's own results are always used).",
    )
    warm_seeds: int = Field(
        default=3,
        ge=0,
        description="Configurations seeded from the performance database per tuning (0: none).",
    )


class ExecutorConfig(PluginChoice):
    name: str = "local"


class BudgetConfig(Strict):
    generations: int = Field(default=8, ge=1, description="Search generations.")
    proposals_per_generation: int = Field(default=4, ge=1, description="Candidates proposed per generation.")
    evaluations: int | None = Field(default=None, ge=1, description="Cap on evaluations (None: no cap).")
    wall_time_s: float | None = Field(default=None, gt=0, description="Cap on wall-clock seconds.")
    llm_tokens: int | None = Field(default=None, ge=0, description="Cap on LLM tokens (prompt + completion).")
    llm_cost_usd: float | None = Field(default=None, ge=0, description="Cap on LLM spend in US dollars.")
    stagnation_generations: int | None = Field(
        default=None,
        ge=1,
        description="Stop after this many generations without a better kernel (None: never).",
    )


class EvaluationConfig(Strict):
    trials: int = Field(default=5, ge=1, description="Correctness trials, each with fresh random inputs.")
    atol: float | None = Field(default=None, gt=0, description="absolute tolerance; None: by dtype")
    rtol: float | None = Field(default=None, gt=0, description="relative tolerance; None: by dtype")
    timeout_s: float = Field(default=120.0, gt=0, description="Wall-clock limit of one evaluation.")
    memory_limit_mb: int | None = Field(default=8192, ge=64, description="Address-space limit of a worker.")
    warmup_s: float = Field(default=0.05, ge=0, description="Warm-up time before timing.")
    min_repeats: int = Field(default=10, ge=3, description="Fewest timed runs.")
    max_repeats: int = Field(default=200, ge=3, description="Most timed runs.")
    target_time_s: float = Field(
        default=0.3, gt=0, description="Time spent measuring each kernel; the repeat count adapts to it."
    )
    rotate_bytes: int = Field(
        default=64 * 2**20,
        ge=0,
        description="Rotate among copies of the inputs until they exceed this many bytes (defeats warm caches).",
    )
    flag_speedup_above: float = Field(
        default=10.0, description="Flag a speedup above this for review even if under the roofline."
    )
    cache: bool = Field(default=True, description="Serve repeat evaluations from the store.")
    compile_cache: bool = Field(
        default=True,
        description="Compile kernels in a separate confined step and keep the artefacts (cubin, OpenCL "
        "binary, HIP code object) in the run's compile cache, keyed by the compile's inputs; False: the "
        "candidate's process compiles its kernels itself, uncached.",
    )
    compile_cache_mb: int = Field(
        default=512, ge=1, description="Size bound of the compile cache (oldest artefacts removed first)."
    )
    compile_timeout_s: float = Field(
        default=120.0, gt=0, description="Wall-clock limit of one kernel's compile."
    )
    shape_variants: int = Field(
        default=2,
        ge=0,
        le=2,
        description="Other shape sets (tiny, ragged) derived from the problem's size constants and tried too.",
    )
    max_trials: int = Field(
        default=100,
        ge=1,
        description="Most correctness trials: cheap kernels get more, up to this, within the budget.",
    )
    correctness_budget_s: float = Field(
        default=1.0,
        ge=0,
        description="Time the extra correctness trials (beyond the required ones) may take.",
    )
    batch_time_s: float = Field(
        default=0.01, gt=0, description="Time of one timed batch of calls (each on distinct fresh inputs)."
    )
    verified_batches: int = Field(
        default=8,
        ge=1,
        description="Timed batches, chosen at random (and the final one), whose outputs are verified.",
    )
    verify_per_batch: int = Field(
        default=1,
        ge=0,
        description="Randomly chosen calls of a verified batch that are checked besides its last call.",
    )
    scratch_mb: int = Field(
        default=512, ge=16, description="Size cap of the candidate's only writable directory."
    )
    max_processes: int = Field(
        default=512, ge=16, description="Most processes and threads the candidate's process may have."
    )


class ProblemConfig(Strict):
    path: str | None = Field(
        default=None, description="Path to a problem file (KernelBench ``.py`` or a native task ``.toml``)."
    )
    shapes: dict[str, int | float] = Field(
        default_factory=dict,
        description="Overrides of module-level shape constants, e.g. ``{batch_size = 8}``.",
    )
    shape_sets: list[dict[str, int | float]] = Field(
        default_factory=list,
        description="Shape sets of a multi-shape run, each over ``shapes`` (e.g. ``[{dim = 256}, {dim = 4096}]``): "
        "candidates are judged on every set, fitness is the geo-mean speedup. Empty: the one set ``shapes``.",
    )
    max_bytes: int = Field(
        default=32 * 2**30,
        ge=1,
        description="Most bytes the inputs plus outputs of one call may take (from shapes and dtypes, "
        "checked before anything is allocated; the device's memory caps it too).",
    )

    @field_validator("shapes")
    @classmethod
    def _finite(cls, shapes: dict[str, int | float]) -> dict[str, int | float]:
        for name, value in shapes.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"shape {name} must be a finite number")
        return shapes


class RunConfig(Strict):
    """Everything a run needs. Every section has defaults: an empty file is a valid config."""

    problem: ProblemConfig = Field(default_factory=ProblemConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    llms: list[LLMConfig] = Field(default_factory=lambda: [LLMConfig()])
    ensemble: EnsembleConfig = Field(default_factory=EnsembleConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    tuner: TunerConfig = Field(default_factory=TunerConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    output_dir: str = Field(default="kf-runs", description="Where run directories are created.")
    seed: int = Field(default=0, description="Seed for search, generators and inputs.")

    @model_validator(mode="after")
    def _at_least_one_llm(self) -> RunConfig:
        if not self.llms:
            raise ValueError("llms must name at least one generator")
        return self


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    data: dict[str, Any] | None = None,
    manager: PluginManager | None = None,
    validate_plugins: bool = True,
) -> RunConfig:
    """Build a :class:`RunConfig` from a TOML file (or ``data``) plus ``--set`` overrides."""
    raw: dict[str, Any] = dict(data or {})
    source = str(path) if path else ""
    if path:
        raw.update(read_toml(path))
    for text in overrides:
        key_path, value = parse_override(text)
        apply_override(raw, key_path, value)
    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source=source)) from None
    except (TypeError, ValueError, RecursionError) as exc:  # raised past pydantic by odd values
        where = f" in {source}" if source else ""
        raise ConfigError(f"config error{where}: {type(exc).__name__}: {short_repr(str(exc))}") from None
    if validate_plugins:
        validate_plugin_options(config, manager or get_plugin_manager(), source=source)
    return config
