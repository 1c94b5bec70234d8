"""The SYCL measurer: the runtime's kernel compiler builds the program; the features come from its SPIR-V.

The device image's backend content (``ext_oneapi_get_backend_content()``, SPIR-V on the OpenCL
backend) is read by :mod:`.spirv` into the loop-weighted mix; local memory is what the runtime
reports per kernel (the largest), else the Workgroup variables the image declares; occupancy is the
local-memory share of the device (as OpenCL's) times the kernel's work-group size limit over the
device's. Where the runtime, a device or the backend content is missing the measurer returns None
(the space warns once and reads the static patterns); a program that does not build gets
``{"measured": 0}``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from kfoundry.core.behaviour import spirv
from kfoundry.core.behaviour.features import derive, merge
from kfoundry.core.behaviour.measure import MeasureContext, with_placeholders
from kfoundry.core.behaviour.mix import weigh
from kfoundry.core.models import DeviceProfile, ParamValue

log = logging.getLogger("kfoundry.descriptors")


def _number(report: dict[str, object], key: str) -> float:
    value = report.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def occupancy(local_bytes: float, device_local: float, kernel_wg: float, device_wg: float) -> float:
    """Work-groups that fit the device's local memory (8 or more: 1) times the kernel's work-group limit share."""
    by_local = 1.0 if local_bytes <= 0 else min(1.0, (device_local // local_bytes) / 8.0)
    by_size = min(1.0, kernel_wg / device_wg) if kernel_wg > 0 and device_wg > 0 else 1.0
    return by_local * by_size


def measure_sycl(
    programs: list[str], params: dict[str, ParamValue], ctx: MeasureContext
) -> dict[str, float] | None:
    """The runtime's SPIR-V of each SYCL program: mix, work-group memory, kernel reports, occupancy."""
    from kfoundry.core.backend import CompileFailed
    from kfoundry.core.errors import BackendUnavailable
    from kfoundry.plugins.backends.sycl_artefact import build_artefact
    from kfoundry.plugins.backends.sycl_runtime import unavailable_reason

    why = unavailable_reason()
    if why:
        log.info("measured descriptors: no SYCL runtime: %s", why)
        return None
    profile = ctx.device if ctx.device is not None and ctx.device.backend == "sycl" else None
    position = profile.index if profile is not None else 0
    out = []
    for src in programs:
        try:
            art = with_placeholders(functools.partial(_build, build_artefact, src, position), params)
        except CompileFailed as exc:
            log.debug("measured descriptors: SYCL program does not build: %s", exc)
            return {"measured": 0.0}
        except (BackendUnavailable, RuntimeError) as exc:
            log.info("measured descriptors: SYCL artefact unavailable: %s", exc)
            return None
        try:
            modules = [spirv.parse(image) for image in art.images]
        except spirv.SpirvError as exc:  # not the OpenCL backend: a native binary, no SPIR-V
            log.info("measured descriptors: SYCL device image is not SPIR-V: %s", exc)
            return None
        if not modules:
            return None
        out.append(_features(modules, art.kernels, art.device, profile, ctx.problem_intensity))
    return {**merge(out), "measured": 1.0}


def _build(build: Any, source: str, position: int, defines: dict[str, ParamValue]) -> Any:
    return build(source, defines, position)


def _features(
    modules: list[spirv.Module],
    reports: dict[str, dict[str, object]],
    device: dict[str, object],
    profile: DeviceProfile | None,
    problem_intensity: float | None,
) -> dict[str, float]:
    mix = weigh([listing for m in modules for listing in m.listings()])
    rows = list(reports.values()) or [{}]
    # the runtime's figure is per kernel; the image's Workgroup variables are the whole module's
    reported = [_number(r, "local_mem_bytes") for r in rows if "local_mem_bytes" in r]
    local_bytes = max(reported) if reported else float(max(m.workgroup_bytes for m in modules))
    kernel_wg = min(
        (_number(r, "max_work_group_size") for r in rows if _number(r, "max_work_group_size")), default=0.0
    )
    device_local = float(
        (profile.local_mem_bytes if profile else None) or _number(device, "local_mem_bytes") or 65536
    )
    device_wg = float(
        (profile.max_work_group_size if profile else None) or _number(device, "max_work_group_size")
    )
    occ = occupancy(local_bytes, device_local, kernel_wg, device_wg)
    feats = derive(mix, shared_bytes=local_bytes, occupancy=occ, problem_intensity=problem_intensity)
    feats["private_mem_bytes"] = max(_number(r, "private_mem_bytes") for r in rows)
    feats["binary_bytes"] = float(sum(4 * m.words for m in modules))
    feats["spirv_instructions"] = float(sum(m.instructions for m in modules))
    return feats
