"""Measured features of a compiled kernel, derived from its instruction mix and resource report.

All features are plain floats in one dict (what ``EvalRecord.descriptors`` and the axes read):

- ``intensity``: FLOPs per byte of global traffic (loop-weighted, from the listing), capped by the
  problem's own FLOPs over its bytes when the problem counts FLOPs: extra traffic the kernel adds
  (re-reads of global memory, spills) lowers it; re-reads served from shared/local memory count once;
- ``hierarchy`` (0-3): 0 scalar global accesses only, 1 wide (vector) or read-only-cache loads,
  2 on-chip exchange (shared/local memory or warp shuffles), 3 both, or asynchronous copies / tensor memory;
- ``mix`` (0-3): 0 no floating-point work to speak of (under 5% of the instructions that compute or
  move data), 1 fp32, 2 special functions or half precision
  (>= 10% of the floating-point work), 3 fp64 (>= 10%) or tensor-core instructions;
- ``occupancy``: theoretical occupancy (0-1);
- shares of the floating-point work (``fp32_share``, ``fp64_share``, ``fp16_share``, ``sfu_share``,
  ``tensor_share``), ``int_share`` of all instructions, ``shuffles``, ``barriers``, ``shared_accesses``,
  ``async_copies``, ``registers``, ``shared_bytes``, ``spill_bytes``.
"""

from __future__ import annotations

from kfoundry.core.behaviour.mix import Mix

FP_CLASSES = ("fp32", "fp64", "fp16", "sfu", "tensor")


def derive(
    mix: Mix,
    *,
    registers: float = 0.0,
    shared_bytes: float = 0.0,
    spill_bytes: float = 0.0,
    occupancy: float = 1.0,
    problem_intensity: float | None = None,
) -> dict[str, float]:
    """The feature dict of one program (see the module docstring)."""
    fp = sum(mix.get(c) for c in FP_CLASSES)
    share = {f"{c}_share": (mix.get(c) / fp if fp else 0.0) for c in FP_CLASSES}
    accesses = mix.get("global_load") + mix.get("global_store") + mix.get("readonly_load")
    kernel_ai = mix.flops / mix.global_bytes if mix.global_bytes else (mix.flops if mix.flops else 0.0)
    intensity = min(kernel_ai, problem_intensity) if problem_intensity else kernel_ai
    on_chip = shared_bytes > 0 or mix.get("shared") > 0
    exchange = mix.get("shuffle") > 0
    deep = mix.get("async_copy") > 0 or (on_chip and exchange)
    wide = accesses > 0 and (mix.wide_accesses + mix.get("readonly_load")) / accesses >= 0.5
    hierarchy = 3 if deep else 2 if (on_chip or exchange) else 1 if wide else 0
    if mix.get("tensor") > 0 or share["fp64_share"] >= 0.1:
        kind = 3
    elif share["sfu_share"] >= 0.1 or share["fp16_share"] >= 0.1:
        kind = 2
    elif fp > 0 and fp >= 0.05 * (mix.total - mix.get("other")):
        kind = 1
    else:
        kind = 0
    return {
        "intensity": float(intensity),
        "kernel_intensity": float(kernel_ai),
        "hierarchy": float(hierarchy),
        "mix": float(kind),
        "occupancy": float(occupancy),
        **share,
        "int_share": mix.share("int"),
        "shuffles": mix.get("shuffle"),
        "barriers": mix.get("barrier"),
        "shared_accesses": mix.get("shared"),
        "async_copies": mix.get("async_copy"),
        "registers": float(registers),
        "shared_bytes": float(shared_bytes),
        "spill_bytes": float(spill_bytes),
    }


def merge(programs: list[dict[str, float]]) -> dict[str, float]:
    """One candidate's features from its programs: the most demanding program on each feature."""
    if not programs:
        return {}
    if len(programs) == 1:
        return dict(programs[0])
    out: dict[str, float] = {}
    for key in programs[0]:
        values = [p[key] for p in programs if key in p]
        out[key] = min(values) if key in ("occupancy", "intensity", "kernel_intensity") else max(values)
    return out
