"""Descriptor axes and their binning, and the run's choice of axes (``search.options.descriptors``).

An axis reads one feature (a static level or a measured feature) and bins it by ascending
``edges``: level = how many edges the value reaches, so ``len(edges) + 1`` levels. A run chooses
``"static"`` (the three pattern axes), ``"measured"`` (intensity, hierarchy, mix, occupancy) or a
list of axes, each a name or ``{name, edges}``.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Axes read from the static pattern extractor (levels 0-3).
STATIC_AXES: tuple[str, ...] = ("memory", "compute", "parallelism")
#: The four measured axes of the published method.
MEASURED_AXES: tuple[str, ...] = ("intensity", "hierarchy", "mix", "occupancy")

#: Every axis a run may name, with its default bin edges.
DEFAULT_EDGES: dict[str, list[float]] = {
    "memory": [1, 2, 3],
    "compute": [1, 2, 3],
    "parallelism": [1, 2, 3],
    "intensity": [0.25, 1.0, 4.0],
    "hierarchy": [1, 2, 3],
    "mix": [1, 2, 3],
    "occupancy": [0.25, 0.5, 0.75],
    "fp32_share": [0.25, 0.5, 0.75],
    "fp64_share": [0.1, 0.5],
    "fp16_share": [0.1, 0.5],
    "sfu_share": [0.05, 0.2],
    "tensor_share": [0.01],
    "int_share": [0.25, 0.5, 0.75],
    "shuffles": [1],
    "barriers": [1],
    "shared_accesses": [1],
    "async_copies": [1],
    "registers": [32, 64, 128],
    "shared_bytes": [1, 16384, 49152],
    "spill_bytes": [1],
}


class AxisSpec(BaseModel):
    """One archive axis: the feature it reads and its bin edges (ascending)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="feature read: a static axis (memory, compute, parallelism) or a measured one"
    )
    edges: list[float] | None = Field(default=None, description="ascending bin edges (default per axis)")

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in DEFAULT_EDGES:
            raise ValueError(f"unknown descriptor axis {value!r} (known: {', '.join(DEFAULT_EDGES)})")
        return value

    @field_validator("edges")
    @classmethod
    def _ascending(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (not value or any(b <= a for a, b in zip(value, value[1:], strict=False))):
            raise ValueError("edges must be a non-empty, strictly ascending list")
        return value

    @property
    def bins(self) -> list[float]:
        return list(self.edges if self.edges is not None else DEFAULT_EDGES[self.name])

    @property
    def levels(self) -> int:
        return len(self.bins) + 1

    @property
    def static(self) -> bool:
        return self.name in STATIC_AXES

    def level(self, value: float) -> int:
        """The bin of ``value``: how many edges it reaches."""
        return bisect_right(self.bins, float(value))


DescriptorChoice = Literal["static", "measured"] | list[str | AxisSpec]


def resolve(choice: DescriptorChoice) -> list[AxisSpec]:
    """The axes a choice names, in order (one-line ``ValueError`` for an unknown or repeated name)."""
    if choice == "static":
        return [AxisSpec(name=n) for n in STATIC_AXES]
    if choice == "measured":
        return [AxisSpec(name=n) for n in MEASURED_AXES]
    if isinstance(choice, str) or not choice:
        raise ValueError('descriptors must be "static", "measured" or a non-empty list of axes')
    axes = [AxisSpec(name=a) if isinstance(a, str) else a for a in choice]
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        raise ValueError(f"descriptor axes repeat a name: {names}")
    return axes


def describe(axes: list[AxisSpec]) -> list[dict[str, object]]:
    """Plain data naming the axes and their edges (stored with the archive; compared on resume)."""
    return [{"name": a.name, "edges": [float(e) for e in a.bins]} for a in axes]


def axes_of_config(config: dict[str, object]) -> list[AxisSpec]:
    """The axes a run's stored configuration (``run.json``'s ``config``) chose; static when unreadable."""
    search = config.get("search")
    options = search.get("options") if isinstance(search, dict) else None
    choice = options.get("descriptors", "static") if isinstance(options, dict) else "static"
    try:
        return resolve(choice if isinstance(choice, str | list) else "static")  # type: ignore[arg-type]
    except ValueError:
        return resolve("static")


#: What each level of the ordinal measured axes means (for prompts and reports).
LEVEL_TEXT: dict[str, list[str]] = {
    "memory": [
        "naive global accesses",
        "coalesced / vectorised",
        "local-memory tiling",
        "register blocking + double buffering",
    ],
    "compute": ["multi-pass", "fused / FMA", "single-pass / streaming / online", "tiled / blocked algorithm"],
    "parallelism": ["work-item only", "work-group barriers", "sub-group / warp intrinsics", "hierarchical"],
    "hierarchy": [
        "scalar global accesses only",
        "vector or read-only-cache loads",
        "shared/local memory or warp shuffles",
        "shared memory and shuffles, or async copies",
    ],
    "mix": [
        "almost no floating-point work",
        "fp32 arithmetic",
        "special functions or half precision",
        "fp64 or tensor-core instructions",
    ],
}
_UNITS = {"intensity": " FLOP/byte (compiled code)", "occupancy": " theoretical occupancy"}


def level_texts(axis: AxisSpec) -> list[str]:
    """One phrase per level of ``axis``: the meaning of an ordinal level, else its value range."""
    if axis.name in LEVEL_TEXT and axis.edges is None:
        return LEVEL_TEXT[axis.name]
    edges, unit = axis.bins, _UNITS.get(axis.name, f" {axis.name.replace('_', ' ')}")
    texts = [f"below {edges[0]:g}{unit}"]
    texts += [f"{lo:g} to {hi:g}{unit}" for lo, hi in zip(edges, edges[1:], strict=False)]
    return texts + [f"{edges[-1]:g} or more{unit}"]


def axis_descriptions(data: object) -> list[tuple[str, list[str]]] | None:
    """(name, level phrases) per axis of a space's ``describe()`` data; None when ``data`` is not one."""
    if not isinstance(data, list) or not data:
        return None
    try:
        axes = [AxisSpec.model_validate(a) for a in data]
    except ValueError:
        return None
    out = []
    for axis, raw in zip(axes, data, strict=True):
        default = DEFAULT_EDGES[axis.name]
        plain = isinstance(raw, dict) and [float(e) for e in raw.get("edges") or []] == [
            float(e) for e in default
        ]
        out.append((axis.name, level_texts(AxisSpec(name=axis.name) if plain else axis)))
    return out
