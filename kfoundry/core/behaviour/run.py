"""What the loop and generators need from the descriptors: the run's space, the resume check, a record's
features, and the run's space as an extractor for a generation request (``extra["descriptors"]``)."""

from __future__ import annotations

import json
from typing import Any

from kfoundry.core.archive import Archive
from kfoundry.core.behaviour.axes import STATIC_AXES, AxisSpec, DescriptorChoice, describe
from kfoundry.core.behaviour.profiling import profiler_for_run, with_traffic
from kfoundry.core.behaviour.space import DescriptorSpace, build_space, descriptor_choice
from kfoundry.core.descriptors import DescriptorExtractor, get_extractor, measured_descriptors
from kfoundry.core.errors import KfError
from kfoundry.core.models import Candidate, EvalRecord


class DescriptorMismatch(KfError):
    """A resumed run's archive was built on other descriptor axes than its configuration names."""


def space_for_run(
    strategy: Any, language: str, evaluator: Any, problem: Any, extractor: DescriptorExtractor | None = None
) -> DescriptorSpace:
    """The descriptor space a run's strategy options choose, for its backend's language and device."""
    backend = getattr(evaluator, "backend", None)
    hip_arch = str(getattr(getattr(backend, "options", None), "arch", "") or "gfx90a")
    space = build_space(
        language,
        descriptor_choice(strategy),
        device=getattr(evaluator, "device", None),
        problem=problem,
        hip_arch=hip_arch if hip_arch.startswith("gfx") else "gfx90a",
        extractor=extractor,
    )
    space.profiler = profiler_for_run(strategy, space.axes, evaluator, problem)
    return space


def check_archive(archive: Archive, space: DescriptorSpace) -> None:
    """Raise :class:`DescriptorMismatch` (one line) when ``archive`` is not laid out on ``space``'s axes.

    An archive saved before axes were recorded was built on the static axes.
    """
    recorded = archive.axes if archive.axes is not None else describe([AxisSpec(name=n) for n in STATIC_AXES])
    if recorded != space.describe() or tuple(archive.dims) != space.dims:
        was = ", ".join(str(a["name"]) for a in recorded)
        raise DescriptorMismatch(
            f"the run's archive is laid out on descriptors ({was}) but search.options.descriptors now names "
            f"({', '.join(space.names)}); resume with the run's own configuration"
        )


def record_descriptors(
    space: DescriptorSpace, candidate: Candidate, coords: tuple[int, ...] | None, record: EvalRecord
) -> dict[str, float]:
    """What ``EvalRecord.descriptors`` holds: the cell's level per axis, the features, the backend's report.

    With the traffic pass on, a correct record's measured traffic updates the candidate's features
    first, and the levels are those of its new cell (:func:`placed` gives the loop that cell).
    """
    if space.measured:
        traffic = with_traffic(space.profiler, candidate, record, space.features(candidate))
        if traffic is not None:
            space.remember(candidate, traffic)
            coords = space.cell(candidate)
    levels = {f"level_{name}": float(v) for name, v in zip(space.names, coords or (), strict=False)}
    static = {
        name: float(v) for name, v in zip(space.names, coords or (), strict=False) if name in STATIC_AXES
    }
    feats = space.features(candidate) if space.measured else {}
    return {**feats, **static, **levels, **measured_descriptors(record)}


def placed(
    space: DescriptorSpace, candidate: Candidate, coords: tuple[int, ...] | None
) -> tuple[int, ...] | None:
    """The candidate's cell after its evaluation (measured traffic may have moved it), else ``coords``."""
    return space.cell(candidate) if space.measured and space.profiler is not None else coords


class SpaceExtractor(DescriptorExtractor):
    """A run's descriptor space seen as an extractor of kernel sources (for generators placing recipes)."""

    def __init__(self, space: DescriptorSpace, language: str) -> None:
        self.space = space
        self.language = language
        self.axes = space.names

    def extract(self, source: str) -> dict[str, int]:
        feats = self.space.features(Candidate(source=source, language=self.language))
        return {a.name: a.level(feats.get(a.name, 0.0)) for a in self.space.axes}


_SPACES: dict[str, SpaceExtractor] = {}


def extractor_for_request(request: Any) -> DescriptorExtractor:
    """The extractor a generator should place kernels with: the run's space (``extra["descriptors"]``).

    Requests without the key, or with the static axes, get the language's registered extractor.
    """
    data = request.extra.get("descriptors") if isinstance(getattr(request, "extra", None), dict) else None
    static = describe([AxisSpec(name=n) for n in STATIC_AXES])
    if not data or data == "static" or data == static:
        return get_extractor(request.language)
    key = json.dumps([request.language, data, getattr(request.device, "key", "")], sort_keys=True)
    if key not in _SPACES:
        choice: DescriptorChoice = (
            "measured" if data == "measured" else [AxisSpec.model_validate(a) for a in data]
        )
        space = build_space(request.language, choice, device=getattr(request, "device", None))
        _SPACES[key] = SpaceExtractor(space, request.language)
    return _SPACES[key]
