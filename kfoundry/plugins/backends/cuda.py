"""NVIDIA CUDA backend: NVRTC (default) or nvcc to a cubin, launched on PyTorch's CUDA tensors.

Without a GPU the backend is compile-only: compile errors and the ptxas resource report are real,
and launching a kernel says in one line that no CUDA device is present. Kernels are found by their
source name (``extern "C"`` names, or the name inside a C++ mangled symbol).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from kfoundry import hookimpl
from kfoundry.core.backend import Backend, BackendCapabilities, BackendOptions, KernelModule
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.hookspecs import Register
from kfoundry.core.models import DeviceProfile, ParamValue
from kfoundry.plugins.backends.cuda_compile import (
    CompileResult,
    choose_arch,
    compile_cuda,
    nvcc_version,
    nvrtc_available,
)
from kfoundry.plugins.backends.cuda_launch import (
    GpuFault,
    LoadedProgram,
    PrimaryContext,
    driver_device_count,
    is_sticky_error,
    require_torch_cuda,
)
from kfoundry.plugins.backends.toolchain import kernel_short_name, unrunnable_kernel

#: Bytes written before each timed call to evict the inputs from L2 (triton.testing.do_bench's size).
L2_FLUSH_BYTES = 256 * 2**20
#: The GPU spins this long before each timed call, so the host's launch overhead never shows in it.
SPIN_NS = 500_000

SPIN_SOURCE = r"""
extern "C" __global__ void kf_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


class CudaOptions(BackendOptions):
    """Options of the CUDA backend."""

    compiler: Literal["auto", "nvrtc", "nvcc"] = Field(
        "auto", description="auto: NVRTC if installed, else nvcc"
    )
    arch: str | None = Field(None, description="target such as sm_90 or sm_90a; None: from the device")
    compile_only: bool = Field(False, description="compile and report resources without running")
    fast_math: bool = Field(False, description="pass --use_fast_math")


class CudaBackend(Backend):
    """CUDA C++ kernels on NVIDIA GPUs."""

    name = "cuda"
    language = "cuda"
    torch_device = "cuda"
    #: cubins are built for a compute capability: a compile job needs no GPU (``compile_discovery``)
    artifacts_need_device = False

    def __init__(self, options: CudaOptions | None = None) -> None:
        super().__init__(options or CudaOptions())
        self.options: CudaOptions
        self._caps: BackendCapabilities | None = None
        self._spin: Callable[..., None] | None = None

    # -- what this machine can do ---------------------------------------------------------------

    def capabilities(self) -> BackendCapabilities:
        if self._caps is None:
            self._caps = self._probe()
        return self._caps

    def _probe(self) -> BackendCapabilities:
        nvrtc_ok, nvrtc_why = nvrtc_available()
        can_compile = nvrtc_ok or nvcc_version() is not None
        count, why = driver_device_count()
        reason = "" if count else f"compile-only: {why}"
        if not can_compile:
            reason = f"no CUDA compiler: {nvrtc_why}; nvcc not on the PATH"
        can_run = bool(count) and not self.options.compile_only and _torch_sees_cuda()
        if count and not can_run and can_compile:
            reason = "compile-only: " + (
                "requested by options" if self.options.compile_only else "PyTorch cannot use CUDA"
            )
        return BackendCapabilities(can_compile=can_compile, can_run=can_run, reason=reason)

    def devices(self) -> list[DeviceProfile]:
        from kfoundry.core.hardware import detect_devices
        from kfoundry.core.peaks import with_peaks
        from kfoundry.plugins.hardware.nvidia import NvidiaDetector

        try:
            found = detect_devices("cuda")
        except Exception:  # the hardware plugin registry is unusable: ask the driver directly
            found = []
        return found or [with_peaks(p) for p in NvidiaDetector().detect("cuda")]

    def toolchain_version(self) -> str:
        return _toolchain_version(self.options.compiler)

    def artifact_toolchain(self) -> str:
        """What a cubin depends on (the compiler, not the driver that loads it): the compile-cache key's
        toolchain, the same on a compile node without a driver as on the GPU's node."""
        return _toolchain_version(self.options.compiler).split("; ")[0]

    def select_device(self, spec: str | int | None = None) -> DeviceProfile:
        chosen = super().select_device(spec)
        self.torch_device = f"cuda:{chosen.index}"
        if chosen.index != 0 and self.capabilities().can_run:  # device 0 is current already; no context made
            import torch

            torch.cuda.set_device(chosen.index)
        return chosen

    # -- compiling and running ------------------------------------------------------------------

    def target_arch(self, source: str) -> str:
        """The architecture to compile for: the option, else the selected device's (sm_90 without one)."""
        if self.options.arch:
            return self.options.arch
        device = self.device
        if device is None and driver_device_count()[0]:
            device = self.require_device()
        return choose_arch(device.compute_capability if device else None, source)

    def compile(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> CompileResult:
        """Compile only: the cubin, log and resource report (raises ``CompileFailed``)."""
        options = list(self.options.build_options) + list(build_options or [])
        if self.options.fast_math:
            options.append("--use_fast_math")
        return compile_cuda(
            source,
            arch=self.target_arch(source),
            compiler=self.options.compiler,
            defines=defines,
            options=options,
        )

    def load(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        return self.load_compiled(self.compile(source, defines=defines, build_options=build_options))

    # -- compile and load as separate steps (the compile service, its cache) ----------------------

    def artifact_target(self) -> str:
        """What a cubin is built for: the ``arch`` option, else the selected device's compute capability."""
        if self.options.arch:
            return self.options.arch
        return self.device.compute_capability or "9.0" if self.device is not None else "9.0"

    def compile_artifact(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
        target: str = "",
        device: str | int | None = None,
    ) -> tuple[bytes, dict[str, Any]]:
        """The cubin for ``target`` (an arch such as ``sm_90``, or a compute capability such as ``9.0``),
        with no device and no driver: a machine without the GPU compiles it."""
        arch = target if target.startswith("sm_") else choose_arch(target or None, source)
        options = list(self.options.build_options) + list(build_options or [])
        if self.options.fast_math:
            options.append("--use_fast_math")
        result = compile_cuda(
            source, arch=arch, compiler=self.options.compiler, defines=defines, options=options
        )
        meta = {
            "arch": result.arch,
            "compiler": result.compiler,
            "log": result.log,
            "compile_time_s": result.compile_time_s,
            "resources": result.resources,
            "ptx": result.ptx,
            "kernels": sorted(result.resources),
        }
        return result.cubin, meta

    def load_artifact(
        self,
        data: bytes,
        meta: dict[str, Any],
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        """Load a cubin the compile service made (``cuModuleLoadData``) on the selected device."""
        resources = meta.get("resources")
        result = CompileResult(
            cubin=data,
            arch=str(meta.get("arch", "")),
            compiler=str(meta.get("compiler", "")),
            log=str(meta.get("log", "")),
            compile_time_s=float(meta.get("compile_time_s") or 0.0),
            resources=resources if isinstance(resources, dict) else {},
            ptx=str(meta.get("ptx", "")),
        )
        return self.load_compiled(result)

    def load_compiled(self, result: CompileResult) -> KernelModule:
        """Load a compiled program (e.g. compiled in another process) on the selected device."""
        resources: dict[str, Any] = {name: dict(report) for name, report in result.resources.items()}
        for report in resources.values():
            report["arch"] = result.arch
            report["compiler"] = result.compiler
        caps = self.capabilities()
        if not caps.can_run:
            kernels = {
                name: unrunnable_kernel(
                    f"cuda: cannot run kernel {name}: no CUDA device is present ({caps.reason})"
                )
                for name in resources
            }
            return KernelModule(kernels, resources, result.compile_time_s, result.log)
        device = self.require_device()
        require_torch_cuda(device.index)
        program = LoadedProgram(result.cubin, PrimaryContext.get(device.index))
        kernels = {}
        for symbol in program.function_names():
            name = kernel_short_name(symbol)
            if name in kernels:  # an overload or template instance: reachable by its full symbol
                name = symbol
            kernel = program.kernel(symbol, name)
            kernels[name] = kernel
            resources.setdefault(name, {}).update({f"driver_{k}": v for k, v in kernel.attributes().items()})
        return KernelModule(kernels, resources, result.compile_time_s, result.log)

    def device_timer(self, flush_last: bool = True) -> Callable[[Callable[[], object]], float] | None:
        """CUDA-event timing of one call on the current stream, L2 flushed first (as do_bench does).

        A short spin then the flush keep the GPU busy while the host issues the call, so launch
        overhead is not counted; the flush comes last, right before the start event, as in do_bench
        (``flush_last=False``: the spin between them, the order before; ``benchmarks/cuda_timer_order.py``). The whole device is then synchronised; if the host saw far more
        time than the events did (work hidden on another stream), the host time is what counts.
        """
        if not self.capabilities().can_run:
            return None
        import time

        import torch

        if self._spin is None:
            self._spin = self.load(SPIN_SOURCE).kf_spin
        spin = self._spin
        # the spin fills every SM (two 1024-thread blocks each), so no kernel of another stream can run
        # inside the window it opens before the start event
        spin_grid = (2 * torch.cuda.get_device_properties(self.torch_device).multi_processor_count,)
        flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.torch_device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def timed(call: Callable[[], object]) -> float:
            self.synchronize()
            if flush_last:
                spin(SPIN_NS, grid=spin_grid, block=(1024,))
                flush.zero_()
            else:
                flush.zero_()
                spin(SPIN_NS, grid=spin_grid, block=(1024,))
            t0 = time.perf_counter()
            start.record()
            call()
            end.record()
            self.synchronize()
            host_ms = (time.perf_counter() - t0) * 1e3
            event_ms = float(start.elapsed_time(end))
            return event_ms if host_ms <= 2 * event_ms + 1.0 + SPIN_NS / 1e6 else host_ms

        return timed

    def synchronize(self) -> None:
        import torch

        if not self.capabilities().can_run:
            raise BackendUnavailable(f"cuda: no CUDA device is present ({self.capabilities().reason})")
        try:
            torch.cuda.synchronize(self.torch_device if self.torch_device != "cuda" else None)
        except RuntimeError as exc:
            if is_sticky_error(exc):
                raise GpuFault(f"kernel faulted on the GPU: {str(exc).splitlines()[0]}") from exc
            raise


@functools.lru_cache(maxsize=1)
def _torch_sees_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken torch CUDA install: treat as no device
        return False


@functools.lru_cache(maxsize=4)
def _toolchain_version(compiler: str) -> str:
    parts = []
    nvrtc_ok, nvrtc_text = nvrtc_available()
    if compiler in ("auto", "nvrtc") and nvrtc_ok:
        parts.append(nvrtc_text)
    else:
        parts.append(nvcc_version() or "no compiler")
    try:
        from cuda.bindings import driver

        code, version = driver.cuDriverGetVersion()
        if int(code) == 0:
            parts.append(f"driver {version // 1000}.{(version % 1000) // 10}")
    except Exception:  # no driver here: compile-only
        parts.append("no driver")
    return "; ".join(parts)


@hookimpl
def kf_register_backends(register: Register) -> None:
    register(
        "cuda",
        CudaBackend,
        options=CudaOptions,
        description="NVIDIA CUDA C++ (NVRTC or nvcc), launched on PyTorch CUDA tensors",
    )


@hookimpl
def kf_register_descriptors(register: Any) -> None:
    from kfoundry.core.behaviour.registry import register_descriptors

    register_descriptors(register, "cuda")


@hookimpl
def kf_register_languages(register: Any) -> None:
    from kfoundry.core.languages import LanguageSpec

    spec = LanguageSpec(
        name="cuda",
        suffixes=(".cu",),
        fences=("cuda", "cu", "c++", "cpp"),
        description="CUDA C++ kernels",
        allowed_imports=("torch.utils.cpp_extension",),  # KernelBench-style load_inline extensions
    )
    register(spec.name, spec)
