"""Measurers: compile a candidate's kernels with the language's own compiler and read the features.

A measurer takes the kernel programs of one candidate (the triple-quoted kernel strings of a
``ModelNew``, or a native source), its template parameters as defines and a :class:`MeasureContext`
(device profile, the problem's intensity), and returns the features of :mod:`.features`; it returns
None when the toolchain it needs is missing (the space then warns once and falls back). A program
that does not compile gets ``{"measured": 0}`` (the candidate fails to compile in evaluation too).
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kfoundry.core.behaviour import amdgpu, cuda, llvm_ir
from kfoundry.core.behaviour.features import derive, merge
from kfoundry.core.models import DeviceProfile, ParamValue

log = logging.getLogger("kfoundry.descriptors")
_T = TypeVar("_T")


@dataclass(frozen=True)
class MeasureContext:
    """What a measurer may need besides the kernels."""

    device: DeviceProfile | None = None
    #: The problem's FLOPs per byte moved (None when the problem counts no FLOPs).
    problem_intensity: float | None = None
    #: The Python source of the candidate (for the launch's block size), or the native source.
    candidate_source: str = ""
    #: The AMDGPU target (HIP).
    hip_arch: str = "gfx90a"


Measurer = Callable[[list[str], dict[str, ParamValue], MeasureContext], "dict[str, float] | None"]

#: A candidate may supply shape-dependent macros at run time (``defines={**PARAMS, **shape}``); an
#: upper-case identifier the compiler reports undefined gets this placeholder value, then it is retried.
PLACEHOLDER = 1024
_UNDEFINED = re.compile(
    r"""identifier "([A-Z][A-Z0-9_]*)" is undefined|undeclared identifier '([A-Z][A-Z0-9_]*)'"""
)


def with_placeholders(
    compile_one: Callable[[dict[str, ParamValue]], _T], params: dict[str, ParamValue]
) -> _T:
    """``compile_one(defines)``, retried with placeholders for undefined upper-case macros (at most 8)."""
    defines = dict(params)
    for _ in range(8):
        try:
            return compile_one(defines)
        except Exception as exc:
            text = f"{exc} {getattr(exc, 'log', '')}"
            names = {a or b for a, b in _UNDEFINED.findall(text)} - set(defines)
            if not names:
                raise
            defines.update({n: PLACEHOLDER for n in names})
    return compile_one(defines)


_BLOCK_EXPR = re.compile(r"\bblock\s*=\s*\(?\s*([^,)\n]+)")


def block_size(candidate_source: str, params: dict[str, ParamValue], ptx: str = "") -> int:
    """Threads per block/work-group: ``__launch_bounds__``, a literal or PARAMS-named ``block=``, else 256."""
    found = cuda.MAXNTID.search(ptx)
    if found:
        return max(1, _product(int(g) for g in found.groups() if g))
    for expr in _BLOCK_EXPR.findall(candidate_source):
        expr = expr.strip()
        if expr.isdigit():
            return int(expr)
        for name, value in params.items():
            if (
                re.search(rf"\b{re.escape(name)}\b", expr)
                and isinstance(value, int)
                and not isinstance(value, bool)
            ):
                return value
    return 256


def _product(values: object) -> int:
    out = 1
    for v in values:  # type: ignore[attr-defined]
        out *= int(v)
    return out


def measure_cuda(
    programs: list[str], params: dict[str, ParamValue], ctx: MeasureContext
) -> dict[str, float] | None:
    """NVRTC/nvcc compile for the device's arch; SASS (nvdisasm) or PTX mix, ptxas resources, occupancy."""
    from kfoundry.core.backend import CompileFailed
    from kfoundry.core.errors import BackendUnavailable
    from kfoundry.plugins.backends.cuda_compile import choose_arch, nvrtc_available

    if not nvrtc_available()[0] and shutil.which("nvcc") is None:
        return None
    capability = ctx.device.compute_capability if ctx.device else None
    limits = cuda.limits_for(capability)
    out = []
    for src in programs:
        try:
            arch = choose_arch(capability, src)
            result = with_placeholders(functools.partial(_cuda_once, src, arch), params)
        except (CompileFailed, BackendUnavailable) as exc:
            log.debug("measured descriptors: CUDA program does not compile: %s", exc)
            return {"measured": 0.0}
        mix, listing = cuda.instruction_mix(result.cubin, result.ptx)
        reports = list(result.resources.values()) or [{}]
        registers = max(int(r.get("registers", 0)) for r in reports)
        shared = max(int(r.get("shared_bytes", 0)) for r in reports)
        spills = max(int(r.get("spill_stores", 0)) + int(r.get("spill_loads", 0)) for r in reports)
        threads = block_size(ctx.candidate_source, params, result.ptx)
        occ = cuda.occupancy(registers, shared, threads, limits)
        feats = derive(
            mix,
            registers=registers,
            shared_bytes=shared,
            spill_bytes=spills,
            occupancy=occ,
            problem_intensity=ctx.problem_intensity,
        )
        feats["from_sass"] = 1.0 if listing == "sass" else 0.0
        out.append(feats)
    return {**merge(out), "measured": 1.0}


def measure_hip(
    programs: list[str], params: dict[str, ParamValue], ctx: MeasureContext
) -> dict[str, float] | None:
    """hipcc compile for the AMDGPU target; ISA mix (llvm-objdump), VGPRs/LDS/occupancy from the metadata."""
    from kfoundry.core.backend import CompileFailed

    hipcc = shutil.which("hipcc")
    if hipcc is None or amdgpu.find_objdump() is None:
        return None
    out = []
    for src in programs:
        try:
            result = with_placeholders(functools.partial(_hip_once, src, hipcc, ctx.hip_arch), params)
        except CompileFailed as exc:
            log.debug("measured descriptors: HIP program does not compile: %s", exc)
            return {"measured": 0.0}
        mix = amdgpu.instruction_mix(result.code_object, result.arch)
        if mix is None:
            return None
        reports = list(result.resources.values()) or [{}]
        registers = max(_num(r.get("registers")) for r in reports)
        shared = max(_num(r.get("shared_bytes")) for r in reports)
        spills = max(_num(r.get("vgpr_spills")) + _num(r.get("sgpr_spills")) for r in reports)
        waves = min(_num(r.get("occupancy_waves_per_simd"), 8.0) for r in reports)
        feats = derive(
            mix,
            registers=registers,
            shared_bytes=shared,
            spill_bytes=spills,
            occupancy=min(1.0, waves / 8.0),
            problem_intensity=ctx.problem_intensity,
        )
        out.append(feats)
    return {**merge(out), "measured": 1.0}


def measure_opencl(
    programs: list[str], params: dict[str, ParamValue], ctx: MeasureContext
) -> dict[str, float] | None:
    """clang's LLVM IR of the OpenCL C: mix and declared local memory; occupancy from local memory per work-group."""
    if llvm_ir.find_clang() is None:
        return None
    out = []
    for src in programs:
        try:
            found = with_placeholders(functools.partial(llvm_ir.instruction_mix, src), params)
        except llvm_ir.IRCompileFailed as exc:
            log.debug("measured descriptors: OpenCL program does not compile with clang: %s", exc)
            return {"measured": 0.0}
        if found is None:
            return None
        mix, local_bytes = found
        local_mem = (ctx.device.local_mem_bytes if ctx.device else None) or 65536
        occ = 1.0 if local_bytes == 0 else min(1.0, (local_mem // max(local_bytes, 1)) / 8.0)
        out.append(
            derive(mix, shared_bytes=local_bytes, occupancy=occ, problem_intensity=ctx.problem_intensity)
        )
    return {**merge(out), "measured": 1.0}


def _cuda_once(source: str, arch: str, defines: dict[str, ParamValue]) -> Any:
    from kfoundry.plugins.backends.cuda_compile import compile_cuda

    return compile_cuda(source, arch=arch, defines=defines)


def _hip_once(source: str, hipcc: str, arch: str, defines: dict[str, ParamValue]) -> Any:
    from kfoundry.plugins.backends.cuda_compile import define_flags
    from kfoundry.plugins.backends.hip import compile_hip

    return compile_hip(source, hipcc=hipcc, arch=arch, flags=define_flags(defines))


def _num(value: object, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
