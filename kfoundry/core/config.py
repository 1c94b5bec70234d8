"""The run configuration: pydantic models, TOML loading, ``--set`` overrides, plugin options.

Unknown keys are errors that name their path; each plugin's ``options`` table is validated
against the options model that plugin registered.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kfoundry.core.errors import ConfigError, PluginError
from kfoundry.core.plugins import PluginKind, PluginManager, get_plugin_manager

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


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
        default=3, ge=0, description="Configurations seeded from the performance database per tuning (0: none)."
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


def _format_location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if not isinstance(part, int) and not _PLAIN_KEY.fullmatch(str(part)):
            part = _short_repr(part, 40)  # a key with spaces, newlines or dots: quoted
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,60}")


def format_validation_error(exc: ValidationError, prefix: str = "", source: str = "") -> str:
    """One line: where the first problem is and what it is."""
    err = exc.errors()[0]
    loc = _format_location(tuple(err["loc"]))
    if prefix:
        loc = f"{prefix}.{loc}" if loc != "(top level)" else prefix
    where = f" in {source}" if source else ""
    if err["type"] == "extra_forbidden":
        return f"config error{where}: unknown key {loc}"
    more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    msg = " ".join(str(err["msg"]).split())[:300]
    return f"config error{where}: {loc}: {msg} (got {_short_repr(err.get('input'))}){more}"


def _short_repr(value: Any, limit: int = 120) -> str:
    """``repr`` on one line, cut to ``limit`` characters (a hostile value may be huge)."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails says nothing useful; the type does
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_INDEX = re.compile(r"[0-9]{1,6}")


def _index(part: str) -> int | None:
    """``part`` as a list index (ASCII digits only), else None."""
    return int(part) if _INDEX.fullmatch(part) else None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a","b","c"], value); the value is read as TOML, else as a string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY.PATH=VALUE")
    key, raw = text.split("=", 1)
    path = [p.strip() for p in key.strip().split(".") if p.strip()]
    if not path:
        raise ConfigError(f"--set {_short_repr(text)}: empty key")
    value: Any = raw.strip()
    try:
        doc = tomllib.loads(f"v = {raw.strip()}")
    except (tomllib.TOMLDecodeError, RecursionError, MemoryError, ValueError):
        return path, value  # not a TOML value: the text itself
    if set(doc) == {"v"}:  # a value with a newline could smuggle in more keys: then it is text
        value = doc["v"]
    return path, value


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``data[path[0]][path[1]]... = value``; ``llms.0.name`` indexes into lists."""
    where = _short_repr(".".join(path))
    node: Any = data
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            idx = _index(part)
            if idx is None or idx >= len(node):
                raise ConfigError(f"--set {where}: no list item {_short_repr(part)}")
            if last:
                node[idx] = value
            else:
                node = node[idx]
            continue
        if not isinstance(node, dict):
            above = ".".join(path[:i]) or "(top level)"
            raise ConfigError(
                f"--set {where}: {_short_repr(above)} holds a value ({type(node).__name__}), not a table"
            )
        if last:
            node[part] = value
            break
        nxt = node.get(part)
        if nxt is None:
            nxt = [{}] if part == "llms" and _index(path[i + 1]) == 0 else {}
            node[part] = nxt
        node = nxt


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {p}: {exc}") from None
    return parse_toml(text, str(p))


def parse_toml(text: str, source: str = "") -> dict[str, Any]:
    """A TOML document as data; every failure is one :class:`ConfigError` line naming ``source``."""
    where = f" in {source}" if source else ""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config error{where}: {exc}") from None
    except (RecursionError, MemoryError, ValueError) as exc:  # nesting deeper than the parser allows
        raise ConfigError(f"config error{where}: unreadable TOML ({type(exc).__name__})") from None


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
        raise ConfigError(f"config error{where}: {type(exc).__name__}: {_short_repr(str(exc))}") from None
    if validate_plugins:
        validate_plugin_options(config, manager or get_plugin_manager(), source=source)
    return config


def plugin_choices(config: RunConfig) -> list[tuple[str, PluginKind, PluginChoice]]:
    """Every plugin a config names: (key path, kind, choice)."""
    choices: list[tuple[str, PluginKind, PluginChoice]] = [
        ("backend", "backend", config.backend),
        ("search", "search", config.search),
        ("tuner", "tuner", config.tuner),
        ("executor", "executor", config.executor),
    ]
    choices += [(f"llms[{i}]", "llm", llm) for i, llm in enumerate(config.llms)]
    return choices


def validate_plugin_options(config: RunConfig, manager: PluginManager, source: str = "") -> None:
    """Check every named plugin exists and its ``options`` match its options model."""
    where = f" in {source}" if source else ""
    for key, kind, choice in plugin_choices(config):
        try:
            spec = manager.get(kind, choice.name)
        except PluginError as exc:
            raise ConfigError(f"config error{where}: {key}.name: {exc}") from None
        try:
            spec.options_model.model_validate(choice.options)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, prefix=f"{key}.options", source=source)) from None
        except (TypeError, ValueError, RecursionError) as exc:  # a plugin's validator raised past pydantic
            raise ConfigError(
                f"config error{where}: {key}.options: {type(exc).__name__}: {_short_repr(str(exc))}"
            ) from None


def plugin_options(choice: PluginChoice, kind: PluginKind, manager: PluginManager | None = None) -> BaseModel:
    """The validated options model instance for a configured plugin."""
    spec = (manager or get_plugin_manager()).get(kind, choice.name)
    return spec.options_model.model_validate(choice.options)


def build_plugin(choice: PluginChoice, kind: PluginKind, manager: PluginManager | None = None) -> Any:
    """Build the plugin object a config section names."""
    spec = (manager or get_plugin_manager()).get(kind, choice.name)
    return spec.build(choice.options)


def resolved_config(config: RunConfig, manager: PluginManager | None = None) -> dict[str, Any]:
    """The config as plain data with every plugin's option defaults filled in."""
    data = config.model_dump(mode="json")
    manager = manager or get_plugin_manager()
    for key, kind, choice in plugin_choices(config):
        try:
            options = plugin_options(choice, kind, manager).model_dump(mode="json")
        except (PluginError, ValidationError):
            continue
        if key.startswith("llms["):
            data["llms"][int(key[5:-1])]["options"] = options
        else:
            data[key]["options"] = options
    return data
