"""Behaviour descriptors: where a kernel sits in the quality-diversity archive.

As in the published KernelFoundry, three static axes are read from the source by weighted pattern
matching (not from runs), each 0-3:

- ``memory``: 0 naive global access, 1 coalesced / vector loads, 2 local/shared-memory tiling,
  3 register blocking plus asynchronous copies or double buffering;
- ``compute``: 0 multi-pass, 1 fused / FMA, 2 single-pass / streaming / online, 3 tiled / blocked;
- ``parallelism``: 0 thread-only, 1 work-group barriers, 2 sub-group / warp intrinsics,
  3 hierarchical (work-group and sub-group levels together).

Extractors are plugins per kernel language (``kf_register_descriptors``), registered by each
language's backend through :func:`kfoundry.core.behaviour.registry.register_descriptors`; an extractor
may carry a *measurer* that compiles the kernel and reads the compiled artefact
(:mod:`kfoundry.core.behaviour`). :func:`measured_descriptors` adds the backend's own report (fraction
of the roofline, registers, local/private memory) from an evaluation record.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kfoundry.core.models import EvalRecord
from kfoundry.core.plugins import PluginManager, get_plugin_manager

AXES: tuple[str, ...] = ("memory", "compute", "parallelism")
LEVELS = 4

log = logging.getLogger("kfoundry.descriptors")
_warned: set[str] = set()

#: ``measurer(programs, defines, context) -> features | None`` (see :mod:`kfoundry.core.behaviour.measure`).
Measurer = Callable[[list[str], dict[str, Any], Any], "dict[str, float] | None"]


def warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time it is seen in this process."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


class DescriptorExtractor(ABC):
    """Reads the static behaviour descriptors of a kernel source in one language."""

    language: str = ""
    axes: tuple[str, ...] = AXES
    levels: int = LEVELS
    #: Compiles a candidate's kernels and returns measured features (None: static patterns only).
    measurer: Measurer | None = None

    @abstractmethod
    def extract(self, source: str) -> dict[str, int]:
        """Axis name -> level (0 .. levels-1)."""

    def cell(self, source: str) -> tuple[int, ...]:
        """The archive coordinates of ``source`` (axis order)."""
        values = self.extract(source)
        return tuple(int(values[a]) for a in self.axes)


@dataclass(frozen=True)
class Pattern:
    """A regular expression that votes ``weight`` for ``level`` on one axis."""

    level: int
    regex: str
    weight: float = 1.0


@dataclass
class PatternDescriptors(DescriptorExtractor):
    """Weighted pattern matching: an axis takes the highest level whose matched weight reaches 1."""

    language: str = ""
    patterns: dict[str, list[Pattern]] = field(default_factory=dict)
    measurer: Measurer | None = None

    def __post_init__(self) -> None:
        self._compiled = {
            axis: [(p.level, re.compile(p.regex, re.MULTILINE), p.weight) for p in pats]
            for axis, pats in self.patterns.items()
        }

    def code(self, source: str) -> str:
        """The text the patterns read: the kernels of ``source`` without C comments (a language may differ)."""
        return strip_comments(kernel_text(source))

    def extract(self, source: str) -> dict[str, int]:
        code = self.code(source)
        out: dict[str, int] = {}
        for axis in self.axes:
            score = [0.0] * self.levels
            for level, regex, weight in self._compiled.get(axis, []):
                if regex.search(code):
                    score[level] += weight
            out[axis] = max((lv for lv in range(self.levels) if score[lv] >= 1.0), default=0)
        return out


_PY_STRINGS = re.compile(r'r?"""(.*?)"""|r?\'\'\'(.*?)\'\'\'', re.DOTALL)
_KERNEL_MARKERS = (
    "__kernel",
    "__global__",
    "__device__",
    "kernel void",
    "SYCL_EXT_ONEAPI_FUNCTION_PROPERTY",
    "sycl/sycl.hpp",
)


def kernel_text(source: str) -> str:
    """The kernel code inside a Python candidate (its triple-quoted strings holding kernels), else ``source``."""
    if "ModelNew" not in source:
        return source
    blocks = [a or b for a, b in _PY_STRINGS.findall(source)]
    kernels = [blk for blk in blocks if any(m in blk for m in _KERNEL_MARKERS)]
    return "\n".join(kernels) if kernels else source


def kernel_programs(source: str, kind: str = "kernelbench") -> list[str]:
    """The kernel programs of a candidate: each triple-quoted kernel string of a ``ModelNew``, or ``source``."""
    if kind == "native" or "ModelNew" not in source:
        return [source]
    blocks = [a or b for a, b in _PY_STRINGS.findall(source)]
    return [blk for blk in blocks if any(m in blk for m in _KERNEL_MARKERS)] or [source]


_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def strip_comments(source: str) -> str:
    """Drop C comments so that a comment naming a technique does not count as using it."""
    return _COMMENTS.sub(" ", source)


# Patterns shared by C-like kernel languages; language specifics are added below.
_COMPUTE = [
    Pattern(1, r"\b(fma|mad|fmaf|__fmaf_rn)\s*\("),
    # a multiply-accumulate into a register block or vector (what compilers fuse); scalar ones count half
    Pattern(1, r"\bacc\w*(\s*\[[^\]]*\])+\s*\+=\s*[^;]*\*", 1.0),
    Pattern(1, r"\+=\s*\(float(v|2|4|8|16)\)[^;]*\*", 1.0),
    Pattern(1, r"\+=\s*[^;{)]*\*", 0.5),
    Pattern(1, r"\bFUSED\b|fused", 0.5),
    Pattern(2, r"online|ONLINE|running_(max|sum)|m_new|rescale", 1.0),
    Pattern(2, r"single[_ -]?pass|welford|Welford", 1.0),
    Pattern(3, r"\b(TILE|TS|TILE_[MNK]|BK|BM|BN)\b", 0.5),
    Pattern(3, r"for\s*\([^;]*;[^;]*;\s*\w+\s*\+=\s*(TILE\w*|TS|BK|TK)\s*\)", 1.0),
]

OPENCL_PATTERNS: dict[str, list[Pattern]] = {
    "memory": [
        Pattern(1, r"\bvload(2|4|8|16)\b|\bvstore(2|4|8|16)\b", 1.0),
        Pattern(1, r"\bfloat(2|4|8|16)\b", 0.5),
        Pattern(1, r"\brestrict\b", 0.25),
        Pattern(2, r"__local\s+\w+\s+\w+\s*\[", 1.0),
        Pattern(3, r"\bacc\s*\[\s*\w+\s*\]|\bacc\w*\s*\[[^\]]+\]\s*\[", 0.6),
        Pattern(3, r"\bcache\w*\s*\[", 0.6),
        Pattern(3, r"\basync_work_group_copy\b|\bprefetch\s*\(|double[_ ]buffer", 0.6),
        Pattern(3, r"#pragma\s+unroll", 0.4),
    ],
    "compute": _COMPUTE,
    "parallelism": [
        Pattern(1, r"\bbarrier\s*\(|\bwork_group_barrier\s*\(", 1.0),
        Pattern(2, r"\bsub_group_\w+\s*\(|\bintel_sub_group\w*", 1.0),
        Pattern(2, r"\bwork_group_reduce_\w+\s*\(", 1.0),
        Pattern(3, r"\bsub_group_\w+\s*\(", 0.5),
        Pattern(3, r"\bbarrier\s*\(", 0.5),
        Pattern(3, r"\batomic_\w+\s*\(|\batom_\w+\s*\(", 0.5),
    ],
}

CUDA_PATTERNS: dict[str, list[Pattern]] = {
    "memory": [
        Pattern(1, r"\bfloat(2|4)\b|reinterpret_cast\s*<\s*(const\s+)?float4", 1.0),
        Pattern(1, r"__ldg\s*\(|__restrict__", 0.5),
        Pattern(2, r"__shared__\s+\w+\s+\w+\s*\[|extern\s+__shared__", 1.0),
        Pattern(3, r"\bacc\s*\[\s*\w+\s*\]|\bacc\w*\s*\[[^\]]+\]\s*\[", 0.6),
        Pattern(3, r"\bcache\w*\s*\[", 0.6),
        Pattern(3, r"\bcp\.async\b|__pipeline_memcpy_async|cuda::memcpy_async|double[_ ]buffer", 0.6),
        Pattern(3, r"#pragma\s+unroll", 0.4),
    ],
    "compute": _COMPUTE,
    "parallelism": [
        Pattern(1, r"__syncthreads\s*\(", 1.0),
        Pattern(2, r"__shfl_(xor_|down_|up_)?sync\s*\(|\b__reduce_\w+_sync\b|cooperative_groups", 1.0),
        Pattern(3, r"__shfl_(xor_|down_|up_)?sync\s*\(", 0.5),
        Pattern(3, r"__syncthreads\s*\(", 0.5),
        Pattern(3, r"\batomic(Add|Max|Min|CAS)\s*\(", 0.5),
    ],
}


HIP_PATTERNS: dict[str, list[Pattern]] = {
    "memory": CUDA_PATTERNS["memory"],
    "compute": _COMPUTE,
    "parallelism": [
        Pattern(1, r"__syncthreads\s*\(", 1.0),
        Pattern(2, r"__shfl(_xor|_down|_up)?(_sync)?\s*\(|\b__ballot\s*\(|cooperative_groups", 1.0),
        Pattern(3, r"__shfl(_xor|_down|_up)?(_sync)?\s*\(", 0.5),
        Pattern(3, r"__syncthreads\s*\(", 0.5),
        Pattern(3, r"\batomic(Add|Max|Min|CAS)\s*\(", 0.5),
    ],
}


def opencl_descriptors(measurer: Measurer | None = None) -> PatternDescriptors:
    return PatternDescriptors(language="opencl", patterns=OPENCL_PATTERNS, measurer=measurer)


def cuda_descriptors(measurer: Measurer | None = None) -> PatternDescriptors:
    return PatternDescriptors(language="cuda", patterns=CUDA_PATTERNS, measurer=measurer)


def hip_descriptors(measurer: Measurer | None = None) -> PatternDescriptors:
    return PatternDescriptors(language="hip", patterns=HIP_PATTERNS, measurer=measurer)


def get_extractor(language: str, manager: PluginManager | None = None) -> DescriptorExtractor:
    """The registered extractor for ``language``; the C patterns, with a one-line warning, when none is."""
    registry = (manager or get_plugin_manager()).registry("descriptor")
    if language in registry:
        return registry.get(language).build()
    known = ", ".join(registry.names()) or "none"
    warn_once(
        f"descriptors: no extractor registered for language {language!r} (registered: {known}); "
        "its kernels are placed by the OpenCL C patterns"
    )
    return PatternDescriptors(language=language, patterns=OPENCL_PATTERNS)


#: Keys of a backend's per-kernel resource report copied into the record's descriptors (largest kernel's).
REPORT_KEYS = (
    "registers",
    "shared_bytes",
    "local_mem_bytes",
    "private_mem_bytes",
    "preferred_multiple",
    "spill_stores",
    "spill_loads",
    "vgpr_spills",
    "sgprs",
    "binary_bytes",
)


def measured_descriptors(record: EvalRecord) -> dict[str, float]:
    """The backend's own report from a record: fraction of the roofline reached, registers, local/private memory."""
    out: dict[str, float] = {}
    if record.roofline_fraction is not None:
        out["roofline_fraction"] = float(record.roofline_fraction)
    for info in record.resources.values() if isinstance(record.resources, dict) else []:
        if not isinstance(info, dict):
            continue
        for key in REPORT_KEYS:
            value = info.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = max(out.get(key, 0.0), float(value))
    return out
