"""AMD HIP backend, compile-only: hipcc (``HIP_PLATFORM=amd``) to an AMDGPU code object per target.

No AMD GPU (ROCm) device is present on our machines, so this backend compiles and reports resources
but never runs: compile errors (with the compiler's log) and the per-kernel resource report are real,
and calling a kernel raises :class:`BackendUnavailable` in one line. The report comes from the code
object's AMDGPU metadata (``llvm-readelf --notes``: VGPRs, SGPRs, AGPRs, LDS, scratch, spills) and
from LLVM's ``kernel-resource-usage`` remarks (occupancy in waves per SIMD). Kernels are found by
their source name (``extern "C"`` names, or the name inside a C++ mangled symbol), as on CUDA.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from kfoundry import hookimpl
from kfoundry.core.backend import Backend, BackendCapabilities, BackendOptions, KernelModule
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.hookspecs import Register
from kfoundry.core.models import DeviceProfile, ParamValue
from kfoundry.plugins.backends.toolchain import (
    define_flags,
    kernel_short_name,
    run_compiler,
    unrunnable_kernel,
)

NO_DEVICE = "compile-only: no AMD GPU (ROCm) device is present"
NO_HIPCC = "hip: hipcc not found (Debian: apt-get install hipcc)"

#: Flags always passed: device code only, one plain ELF code object (no offload bundle), the report,
#: and the HIP runtime header pre-included (threadIdx, __shfl_down, ... without an #include, as on NVRTC).
BASE_FLAGS = [
    "--genco",
    "--no-gpu-bundle-output",
    "-Rpass-analysis=kernel-resource-usage",
    "-O3",
    "-std=c++17",
    "-include",
    "hip/hip_runtime.h",
]

#: Kernel-level scalar fields of the AMDGPU metadata -> resource keys (CUDA's names where they map).
_METADATA_KEYS = {
    ".vgpr_count": "registers",
    ".sgpr_count": "sgprs",
    ".agpr_count": "agprs",
    ".group_segment_fixed_size": "shared_bytes",
    ".private_segment_fixed_size": "stack_bytes",
    ".vgpr_spill_count": "vgpr_spills",
    ".sgpr_spill_count": "sgpr_spills",
    ".wavefront_size": "wavefront_size",
    ".max_flat_workgroup_size": "max_threads_per_block",
    ".kernarg_segment_size": "kernarg_bytes",
}
#: ``-Rpass-analysis=kernel-resource-usage`` remark labels -> resource keys.
_REMARK_KEYS = {
    "VGPRs": "registers",
    "SGPRs": "sgprs",
    "AGPRs": "agprs",
    "ScratchSize [bytes/lane]": "stack_bytes",
    "Occupancy [waves/SIMD]": "occupancy_waves_per_simd",
    "SGPRs Spill": "sgpr_spills",
    "VGPRs Spill": "vgpr_spills",
    "LDS Size [bytes/block]": "shared_bytes",
}
_REMARK = re.compile(r"remark:\s+(.+?):\s+(\S+)\s+\[-Rpass-analysis=kernel-resource-usage\]")
_FIELD = re.compile(r"^    (\.\w+):\s+(\S+)\s*$")


class HipOptions(BackendOptions):
    """Options of the HIP backend."""

    arch: str = Field(
        "gfx90a",
        pattern=r"^gfx[0-9a-f]{3,4}(:[a-z]+[+-])*$",
        description="AMDGPU target: gfx90a (MI200), gfx908 (MI100), gfx940 (MI300); features as gfx90a:xnack+",
    )
    hipcc: str = Field("hipcc", description="the hipcc to use: a name on the PATH or a path")
    timeout_s: float = Field(300.0, gt=0, description="give up on one compile after this long")


@dataclass
class HipCompileResult:
    """A compiled program: the code object, the compiler's log and a per-kernel resource report."""

    code_object: bytes
    arch: str
    log: str
    compile_time_s: float
    #: Kernel symbol (as in the code object, possibly mangled) -> resource report.
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)


class HipBackend(Backend):
    """HIP C++ kernels for AMD GPUs (compile-only here: no AMD GPU is present)."""

    name = "hip"
    language = "hip"
    torch_device = "cpu"
    #: code objects are built for the ``arch`` option: a compile job needs no GPU (``compile_discovery``)
    artifacts_need_device = False

    def __init__(self, options: HipOptions | None = None) -> None:
        super().__init__(options or HipOptions())
        self.options: HipOptions

    # -- what this machine can do ---------------------------------------------------------------

    def hipcc_path(self) -> str | None:
        """The hipcc executable, or None when it is not installed."""
        return shutil.which(self.options.hipcc)

    def capabilities(self) -> BackendCapabilities:
        if self.hipcc_path() is None:
            return BackendCapabilities(can_compile=False, can_run=False, reason=NO_HIPCC)
        return BackendCapabilities(can_compile=True, can_run=False, reason=NO_DEVICE)

    def devices(self) -> list[DeviceProfile]:
        return []  # compile-only: no ROCm runtime is used, so no AMD device is ever seen

    def toolchain_version(self) -> str:
        hipcc = self.hipcc_path()
        return _hipcc_version(hipcc) if hipcc else "no hipcc"

    # -- compiling ------------------------------------------------------------------------------

    def compile(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> HipCompileResult:
        """Compile only: the code object, log and resource report (raises ``CompileFailed``)."""
        hipcc = self.hipcc_path()
        if hipcc is None:
            raise BackendUnavailable(NO_HIPCC)
        flags = define_flags(defines) + list(self.options.build_options) + list(build_options or [])
        return compile_hip(
            source, hipcc=hipcc, arch=self.options.arch, flags=flags, timeout_s=self.options.timeout_s
        )

    def load(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        # Never selects a device (there is none): the target comes from the options, as CUDA's
        # compile-only path takes its arch without asking the driver.
        return self.load_compiled(self.compile(source, defines=defines, build_options=build_options))

    # -- compile and load as separate steps (the compile service, its cache) ----------------------

    def artifact_target(self) -> str:
        return self.options.arch

    def compile_artifact(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
        target: str = "",
        device: str | int | None = None,
    ) -> tuple[bytes, dict[str, Any]]:
        """The code object for the ``arch`` option, and its log and resources."""
        result = self.compile(source, defines=defines, build_options=build_options)
        meta = {
            "arch": result.arch,
            "log": result.log,
            "compile_time_s": result.compile_time_s,
            "resources": result.resources,
            "kernels": sorted(kernel_short_name(k) for k in result.resources),
        }
        return result.code_object, meta

    def load_artifact(
        self,
        data: bytes,
        meta: dict[str, Any],
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        resources = meta.get("resources")
        return self.load_compiled(
            HipCompileResult(
                code_object=data,
                arch=str(meta.get("arch", "")),
                log=str(meta.get("log", "")),
                compile_time_s=float(meta.get("compile_time_s") or 0.0),
                resources=resources if isinstance(resources, dict) else {},
            )
        )

    def load_compiled(self, result: HipCompileResult) -> KernelModule:
        """A module whose kernels carry their resource report and refuse to run."""
        kernels: dict[str, Any] = {}
        resources: dict[str, Any] = {}
        for symbol, report in result.resources.items():
            name = kernel_short_name(symbol)
            if name in kernels:  # an overload or template instance: reachable by its full symbol
                name = symbol
            kernels[name] = unrunnable_kernel(
                f"hip: cannot run kernel {name}: no AMD GPU device is present (compile-only)"
            )
            resources[name] = {**report, "symbol": symbol, "arch": result.arch, "compiler": "hipcc"}
        return KernelModule(kernels, resources, result.compile_time_s, result.log)

    def synchronize(self) -> None:
        return None  # nothing is ever queued


def hip_env() -> dict[str, str]:
    """The environment for hipcc: the AMD platform forced (with nvcc on the PATH hipcc picks NVIDIA)."""
    return {**os.environ, "HIP_PLATFORM": "amd"}


def compile_hip(
    source: str, *, hipcc: str, arch: str, flags: list[str], timeout_s: float = 300.0
) -> HipCompileResult:
    """Compile ``source`` for ``arch`` to a code object; raise :class:`CompileFailed` with the log."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kf-hipcc-") as tmp:
        src = Path(tmp) / "candidate.hip"
        out = Path(tmp) / "candidate.co"
        src.write_text(source)
        cmd = [hipcc, *BASE_FLAGS, f"--offload-arch={arch}", *flags, "-o", str(out), str(src)]
        code_object, log = run_compiler("hipcc", cmd, out, timeout_s, env=hip_env(), cwd=tmp)
        elapsed = time.perf_counter() - started
        resources = merge_reports(read_metadata(out), parse_remarks(log))
    return HipCompileResult(code_object, arch, log, elapsed, resources)


def merge_reports(
    metadata: dict[str, dict[str, Any]] | None, remarks: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The metadata's kernels (authoritative), with the remarks' occupancy added.

    Without metadata (no llvm-readelf), the remarks alone: every function left un-inlined, which with
    hipcc's default of inlining everything is every kernel.
    """
    if metadata is None:
        return remarks
    merged: dict[str, dict[str, Any]] = {}
    for symbol, report in metadata.items():
        extra = remarks.get(symbol, {})
        merged[symbol] = {**report, **{k: v for k, v in extra.items() if k not in report}}
    return merged


def parse_remarks(log: str) -> dict[str, dict[str, Any]]:
    """Per-function numbers of the ``-Rpass-analysis=kernel-resource-usage`` remarks."""
    report: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in log.splitlines():
        found = _REMARK.search(line)
        if not found:
            continue
        label, value = found.group(1).strip(), found.group(2)
        if label == "Function Name":
            current = report.setdefault(value, {})
        elif current is not None and label in _REMARK_KEYS:
            current[_REMARK_KEYS[label]] = _number(value)
    return report


def parse_metadata_notes(text: str) -> dict[str, dict[str, Any]]:
    """Kernel-level fields of ``llvm-readelf --notes`` AMDGPU metadata (the ``amdhsa.kernels`` list)."""
    report: dict[str, dict[str, Any]] = {}
    in_kernels = False
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if line.startswith("amdhsa.kernels:"):
            in_kernels = True
            continue
        if not in_kernels:
            continue
        if line and not line.startswith(" "):  # the next top-level key (amdhsa.target, ...)
            break
        if line.startswith("  - "):
            current = {}
            line = "    " + line[4:]
        if current is None:
            continue
        found = _FIELD.match(line)
        if not found:
            continue
        key, value = found.groups()
        if key == ".name":
            report[value] = current
        elif key in _METADATA_KEYS:
            current[_METADATA_KEYS[key]] = _number(value)
        elif key == ".uses_dynamic_stack":
            current["uses_dynamic_stack"] = value == "true"
    return report


def read_metadata(code_object: Path) -> dict[str, dict[str, Any]] | None:
    """The code object's per-kernel metadata, or None when no llvm-readelf is found."""
    readelf = find_readelf()
    if readelf is None:
        return None
    try:
        proc = subprocess.run(
            [readelf, "--notes", str(code_object)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 or "amdhsa.kernels" not in proc.stdout:
        return None
    return parse_metadata_notes(proc.stdout)


@functools.lru_cache(maxsize=1)
def find_readelf() -> str | None:
    """An llvm-readelf: ROCm's, the newest Debian LLVM's, else the one on the PATH."""
    rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
    candidates = [str(Path(rocm) / "llvm" / "bin" / "llvm-readelf")]
    candidates += sorted(glob.glob("/usr/lib/llvm-*/bin/llvm-readelf"), key=_llvm_major, reverse=True)
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("llvm-readelf")


def _llvm_major(path: str) -> int:
    found = re.search(r"llvm-(\d+)", path)
    return int(found.group(1)) if found else 0


def _number(text: str) -> int | str:
    return int(text) if text.isdigit() else text


@functools.lru_cache(maxsize=4)
def _hipcc_version(hipcc: str) -> str:
    """``hipcc HIP 5.2.21153-0, clang 15.0.6`` (the platform forced to AMD)."""
    try:
        out = subprocess.run(
            [hipcc, "--version"], capture_output=True, text=True, timeout=60, env=hip_env()
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "hipcc (version unknown)"
    hip = re.search(r"HIP version:\s*(\S+)", out)
    clang = re.search(r"clang version\s*(\S+)", out)
    parts = [f"hipcc HIP {hip.group(1)}" if hip else "hipcc"]
    if clang:
        parts.append(f"clang {clang.group(1)}")
    return ", ".join(parts)


@hookimpl
def kf_register_backends(register: Register) -> None:
    register(
        "hip",
        HipBackend,
        options=HipOptions,
        description="AMD HIP C++ (hipcc, HIP_PLATFORM=amd), compile-only: resource report, no AMD GPU to run on",
    )


@hookimpl
def kf_register_descriptors(register: Any) -> None:
    from kfoundry.core.behaviour.registry import register_descriptors

    register_descriptors(register, "hip")


@hookimpl
def kf_register_languages(register: Any) -> None:
    from kfoundry.core.languages import LanguageSpec

    spec = LanguageSpec(
        name="hip", suffixes=(".hip",), fences=("hip", "c++", "cpp"), description="HIP C++ kernels"
    )
    register(spec.name, spec)
