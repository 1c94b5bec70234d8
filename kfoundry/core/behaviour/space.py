"""The run's descriptor space: its axes, grid dimensions and each candidate's cell.

:func:`build_space` reads the choice from the search strategy's options
(``search.options.descriptors``), takes the language's registered extractor (static patterns plus,
where the language has one, a measurer) and the problem's intensity. Features are computed once per
candidate content hash. A language whose extractor has no measurer (or whose toolchain is missing)
gets one warning line, and its measured axes are read from the static pattern levels instead.
"""

from __future__ import annotations

import ast
import logging
import re
from typing import Any

from kfoundry.core.behaviour.axes import STATIC_AXES, AxisSpec, DescriptorChoice, describe, resolve
from kfoundry.core.behaviour.measure import MeasureContext
from kfoundry.core.descriptors import DescriptorExtractor, get_extractor, kernel_programs
from kfoundry.core.models import Candidate, DeviceProfile, ParamValue
from kfoundry.core.plugins import PluginManager

log = logging.getLogger("kfoundry.descriptors")
_warned: set[tuple[str, str]] = set()

#: Measured features read from static levels when nothing was measured (see the module docstring).
_STATIC_STAND_IN = {
    "hierarchy": "memory",
    "intensity": "compute",
    "mix": "compute",
    "occupancy": "parallelism",
}


def warn_once(language: str, message: str) -> None:
    if (language, message) not in _warned:
        _warned.add((language, message))
        log.warning(message)


_DEFAULTS = re.compile(r"^#.*\bPARAMS\b.*\bdefaults:\s*(\{[^\n}]*\})\s*$", re.MULTILINE)


def declared_defaults(source: str) -> dict[str, ParamValue]:
    """The ``# PARAMS ... defaults: {...}`` comment of a rendered recipe, else {}.

    Without it every tunable would compile with the placeholder (1024): a tile of 1024x1024 fully
    unrolled took NVRTC 270 s for one recipe.
    """
    found = _DEFAULTS.search(source)
    if not found:
        return {}
    try:
        value = ast.literal_eval(found.group(1))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {
        str(k): v for k, v in value.items() if isinstance(k, str) and isinstance(v, int | float | str | bool)
    }


class DescriptorSpace:
    """Axes, dimensions and cells of one run's archive."""

    def __init__(
        self,
        axes: list[AxisSpec],
        extractor: DescriptorExtractor,
        context: MeasureContext | None = None,
    ) -> None:
        self.axes = axes
        self.extractor = extractor
        self.context = context or MeasureContext()
        self._cache: dict[str, dict[str, float]] = {}
        #: The ncu traffic pass (``profiling.TrafficProfiler``), when the run has it on.
        self.profiler: Any = None

    @property
    def profile_warning(self) -> str | None:
        return getattr(self.profiler, "warning", None)

    def remember(self, candidate: Candidate, features: dict[str, float]) -> None:
        """Replace ``candidate``'s features (measured traffic arrived after its evaluation)."""
        self._cache[candidate.content_hash] = dict(features)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(a.levels for a in self.axes)

    @property
    def measured(self) -> bool:
        return any(not a.static for a in self.axes)

    def describe(self) -> list[dict[str, object]]:
        return describe(self.axes)

    def features(self, candidate: Candidate) -> dict[str, float]:
        """Static levels and (for a measured space) the measured features of ``candidate``."""
        key = candidate.content_hash
        if key not in self._cache:
            feats: dict[str, float] = {
                k: float(v) for k, v in self.extractor.extract(candidate.source).items()
            }
            if self.measured:
                feats.update(self._measure(candidate, feats))
            self._cache[key] = feats
        return dict(self._cache[key])

    def cell(self, candidate: Candidate) -> tuple[int, ...]:
        feats = self.features(candidate)
        return tuple(a.level(feats.get(a.name, 0.0)) for a in self.axes)

    def _measure(self, candidate: Candidate, static: dict[str, float]) -> dict[str, float]:
        language = candidate.language
        measured = None
        if self.extractor.measurer is None:
            warn_once(
                language,
                f"descriptors: language {language!r} has no measured descriptors; "
                "its measured axes are read from the static patterns",
            )
        else:
            params = dict(candidate.params)
            if candidate.space is not None:
                params = {**{k: v[0] for k, v in candidate.space.params.items() if v}, **params}
            if not params:  # a bare source (a generator placing a recipe): the defaults it declares
                params = declared_defaults(candidate.source)
            context = MeasureContext(
                device=self.context.device,
                problem_intensity=self.context.problem_intensity,
                candidate_source=candidate.source,
                hip_arch=self.context.hip_arch,
            )
            measured = self.extractor.measurer(
                kernel_programs(candidate.source, candidate.kind), params, context
            )
            if measured is None:
                warn_once(
                    language,
                    f"descriptors: the {language} toolchain the measured descriptors need is "
                    "missing; its measured axes are read from the static patterns",
                )
        if measured is None or not measured.get("measured"):
            stand_in = {name: static.get(src, 0.0) for name, src in _STATIC_STAND_IN.items()}
            return {**stand_in, **(measured or {}), "measured": 0.0}
        return measured


def descriptor_choice(strategy: Any) -> DescriptorChoice:
    """The strategy's ``descriptors`` option ("static" when it has none)."""
    choice: DescriptorChoice = getattr(getattr(strategy, "options", None), "descriptors", "static")
    return choice


def build_space(
    language: str,
    choice: DescriptorChoice = "static",
    *,
    device: DeviceProfile | None = None,
    problem: Any = None,
    hip_arch: str = "gfx90a",
    extractor: DescriptorExtractor | None = None,
    manager: PluginManager | None = None,
) -> DescriptorSpace:
    """The descriptor space of a run in ``language`` (see the module docstring)."""
    axes = resolve(choice)
    ex = extractor or get_extractor(language, manager)
    intensity = None
    if problem is not None and any(not a.static for a in axes):  # the static axes never read it
        try:
            flops, moved = float(problem.flops), float(problem.bytes_moved)
        except Exception:  # a problem whose analysis fails is refused by the evaluator; no cap here
            flops, moved = 0.0, 0.0
        intensity = flops / moved if flops > 0 and moved > 0 else None
    context = MeasureContext(device=device, problem_intensity=intensity, hip_arch=hip_arch)
    return DescriptorSpace(axes, ex, context)


__all__ = ["STATIC_AXES", "DescriptorSpace", "build_space", "descriptor_choice", "warn_once"]
