"""Static behaviour descriptors of SYCL kernels: the OpenCL/CUDA patterns in SYCL's vocabulary.

Registered for the ``sycl`` language by the SYCL backend (:mod:`kfoundry.core.behaviour.registry`), with
the measurer of :mod:`kfoundry.core.behaviour.measure_sycl` (the runtime's SPIR-V); these patterns
are the static axes, and the measured axes' stand-in where the SYCL runtime is missing.
"""

from __future__ import annotations

from kfoundry.core.descriptors import OPENCL_PATTERNS, Measurer, Pattern, PatternDescriptors

SYCL_PATTERNS: dict[str, list[Pattern]] = {
    "memory": [
        Pattern(1, r"\bsycl::vec\s*<|\bsycl::(float|int)(2|4|8|16)\b|\bmarray\s*<", 1.0),
        Pattern(1, r"\.load\s*\(|\.store\s*\(", 0.5),
        Pattern(1, r"__restrict__|\brestrict\b", 0.25),
        Pattern(2, r"\bwork_group_static\s*<|\blocal_accessor\s*<|\bwork_group_memory\s*<", 1.0),
        Pattern(3, r"\bacc\s*\[\s*\w+\s*\]|\bacc\w*\s*\[[^\]]+\]\s*\[", 0.6),
        Pattern(3, r"\bcache\w*\s*\[", 0.6),
        Pattern(3, r"\bprefetch\s*\(|double[_ ]buffer|\basync_work_group_copy\b", 0.6),
        Pattern(3, r"#pragma\s+unroll", 0.4),
    ],
    "compute": OPENCL_PATTERNS["compute"],
    "parallelism": [
        Pattern(1, r"\bgroup_barrier\s*\(|\.barrier\s*\(", 1.0),
        Pattern(
            2, r"\bsub_group\b|\bget_sub_group\s*\(|\bshift_group_\w+\s*\(|\bpermute_group_\w+\s*\(", 1.0
        ),
        Pattern(
            2, r"\bselect_from_group\s*\(|\breduce_over_group\s*\(|\b(ex|in)clusive_scan_over_group\s*\(", 1.0
        ),
        Pattern(3, r"\bsub_group\b|\bget_sub_group\s*\(", 0.5),
        Pattern(3, r"\bgroup_barrier\s*\(|\.barrier\s*\(", 0.5),
        Pattern(3, r"\batomic_ref\s*<|\batomic_fetch_\w+\s*\(", 0.5),
    ],
}


def sycl_descriptors(measurer: Measurer | None = None) -> PatternDescriptors:
    return PatternDescriptors(language="sycl", patterns=SYCL_PATTERNS, measurer=measurer)
