"""What the optimize loop needs from the descriptors: the run's space, the resume check, a record's features."""

from __future__ import annotations

from typing import Any

from kfoundry.core.archive import Archive
from kfoundry.core.behaviour.axes import STATIC_AXES, AxisSpec, describe
from kfoundry.core.behaviour.space import DescriptorSpace, build_space, descriptor_choice
from kfoundry.core.descriptors import DescriptorExtractor, measured_descriptors
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
    return build_space(
        language,
        descriptor_choice(strategy),
        device=getattr(evaluator, "device", None),
        problem=problem,
        hip_arch=hip_arch if hip_arch.startswith("gfx") else "gfx90a",
        extractor=extractor,
    )


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
    """What ``EvalRecord.descriptors`` holds: the cell's level per axis, the features, the backend's report."""
    levels = {f"level_{name}": float(v) for name, v in zip(space.names, coords or (), strict=False)}
    static = {
        name: float(v) for name, v in zip(space.names, coords or (), strict=False) if name in STATIC_AXES
    }
    feats = space.features(candidate) if space.measured else {}
    return {**feats, **static, **levels, **measured_descriptors(record)}
