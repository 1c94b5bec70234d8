"""The OpenCL backend (pyopencl): the embedded default, running for real on PoCL's CPU device.

Device selection by index or name substring across all platforms; template parameters become
``-D NAME=VALUE`` build options; the build log is kept (feedback on failure, resources on success).
On CPU devices torch tensors are wrapped zero-copy (``CL_MEM_USE_HOST_PTR`` over the tensor's own
memory), so timings measure the kernel, not copies; on other devices tensors are copied in and out
around each launch. Launches are asynchronous: :meth:`OpenCLBackend.synchronize` waits for them
(and releases the buffers kept alive until then).

Also registers the ``opencl`` hardware detector: a :class:`DeviceProfile` per device from
``clGetDeviceInfo``.
"""

from __future__ import annotations

import ctypes
import functools
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from kfoundry import hookimpl
from kfoundry.core.backend import BackendCapabilities, BackendOptions, CompileFailed, KernelModule
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.hardware import HardwareDetector
from kfoundry.core.models import DeviceProfile, ParamValue
from kfoundry.core.peaks import with_peaks
from kfoundry.core.plugins import NoOptions
from kfoundry.plugins.backends.launch import (
    KernelLauncher,
    LaunchError,
    QueueBackend,
    device_profile,
    launch_dims,
)
from kfoundry.runtime import LocalMemory

if TYPE_CHECKING:  # torch is imported where a launch needs it: `kf-run plugins` need not wait a second for it
    import torch

try:
    import pyopencl as cl
except ImportError:  # pragma: no cover - pyopencl is a core dependency
    cl = None  # type: ignore[assignment]


__all__ = ["LaunchError", "OpenCLBackend", "OpenCLHardware", "OpenCLOptions", "profile_of"]


class OpenCLOptions(BackendOptions):
    """Options of the OpenCL backend."""

    platform: str | None = Field(
        default=None, description="only devices of platforms whose name contains this"
    )
    fast_math: bool = Field(default=False, description="build with -cl-fast-relaxed-math")
    zero_copy: bool | None = Field(
        default=None, description="wrap tensor memory in place (None: on PoCL CPU devices) instead of copying"
    )


def _device_type(dev: Any) -> str:
    t = dev.type
    if t & cl.device_type.GPU:
        return "gpu"
    if t & cl.device_type.CPU:
        return "cpu"
    if t & cl.device_type.ACCELERATOR:
        return "accelerator"
    return "other"


def _info(dev: Any, name: str, default: Any = None) -> Any:
    try:
        return getattr(dev, name)
    except Exception:
        return default


def profile_of(dev: Any, index: int) -> DeviceProfile:
    """A :class:`DeviceProfile` from ``clGetDeviceInfo``."""
    exts = str(_info(dev, "extensions", ""))
    sub_groups: list[int] | None = None
    try:
        sub_groups = [int(x) for x in dev.get_info(0x4108)] or None  # CL_DEVICE_SUB_GROUP_SIZES_INTEL
    except Exception:
        sub_groups = None
    info = {
        "name": dev.name,
        "vendor": _info(dev, "vendor", ""),
        "device_type": _device_type(dev),
        "compute_units": _info(dev, "max_compute_units"),
        "max_work_group_size": _info(dev, "max_work_group_size"),
        "max_work_item_sizes": _info(dev, "max_work_item_sizes", []),
        "local_mem_bytes": _info(dev, "local_mem_size"),
        "global_mem_bytes": _info(dev, "global_mem_size"),
        "sub_group_sizes": sub_groups,
        "preferred_vector_width_float": _info(dev, "preferred_vector_width_float"),
        "clock_mhz": _info(dev, "max_clock_frequency", 0),
        "l2_cache_bytes": _info(dev, "global_mem_cache_size"),
    }
    return device_profile(
        "opencl",
        index,
        info,
        driver_version=f"{dev.platform.version.strip()}; driver {_info(dev, 'driver_version', '')}",
        extra={
            "platform": dev.platform.name.strip(),
            "opencl_version": str(_info(dev, "version", "")).strip(),
            "fp64": "cl_khr_fp64" in exts,
            "fp16": "cl_khr_fp16" in exts,
        },
    )


def _all_devices(platform_filter: str | None = None) -> list[Any]:
    if cl is None:
        return []
    try:
        platforms = cl.get_platforms()
    except Exception:
        return []
    out: list[Any] = []
    for p in platforms:
        if platform_filter and platform_filter.lower() not in p.name.lower():
            continue
        try:
            out.extend(p.get_devices())
        except Exception:
            continue
    return out


def _define(name: str, value: ParamValue) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, float):
        return f"-D{name}={value!r}f" if np.isfinite(value) else f"-D{name}={value}"
    return f"-D{name}={value}"


class OpenCLBackend(QueueBackend[tuple[Any, Any]]):
    """OpenCL through pyopencl (see module docstring)."""

    name = "opencl"
    language = "opencl"
    torch_device = "cpu"

    def __init__(self, options: OpenCLOptions | None = None) -> None:
        super().__init__(options or OpenCLOptions())
        self.options: OpenCLOptions
        self._cl_devices: list[Any] | None = None

    # -- discovery ------------------------------------------------------------------------------

    def _devices_raw(self) -> list[Any]:
        if self._cl_devices is None:
            self._cl_devices = _all_devices(self.options.platform)
        return self._cl_devices

    def capabilities(self) -> BackendCapabilities:
        if cl is None:
            return BackendCapabilities(can_compile=False, can_run=False, reason="pyopencl is not installed")
        if not self._devices_raw():
            return BackendCapabilities(
                can_compile=False,
                can_run=False,
                reason="no OpenCL device (install pyopencl[pocl] for a CPU one)",
            )
        return BackendCapabilities(can_compile=True, can_run=True)

    def devices(self) -> list[DeviceProfile]:
        """Every device (all platforms), peak rates filled in where measured (``kf-run devices --measure``)."""
        return [with_peaks(profile_of(d, i)) for i, d in enumerate(self._devices_raw())]

    def toolchain_version(self) -> str:
        dev = self._cl_device()
        return f"pyopencl {cl.VERSION_TEXT}; {dev.platform.version.strip()}; {dev.driver_version}"

    # -- context --------------------------------------------------------------------------------

    def _cl_device(self) -> Any:
        profile = self.require_device()
        return self._devices_raw()[profile.index]

    def _open(self) -> tuple[Any, Any]:
        """A context and an in-order queue on the selected device."""
        dev = self._cl_device()
        try:
            ctx = cl.Context([dev])
            return ctx, cl.CommandQueue(ctx, dev)
        except Exception as exc:
            raise BackendUnavailable(f"opencl: cannot create a context on {dev.name}: {exc}") from None

    # -- compile --------------------------------------------------------------------------------

    def _options(self, defines: dict[str, ParamValue] | None, build_options: list[str] | None) -> list[str]:
        options = [_define(k, v) for k, v in (defines or {}).items()]
        options += list(self.options.build_options) + list(build_options or [])
        if self.options.fast_math:
            options.append("-cl-fast-relaxed-math")
        return options

    def _build(self, program: Any, options: list[str]) -> Any:
        try:
            return program.build(options=options)
        except cl.Error as exc:
            log = str(exc)
            lines = [ln for ln in log.splitlines() if "error" in ln.lower() and "clBuildProgram" not in ln]
            lines += [ln for ln in log.splitlines() if ln.startswith("Invalid build option")]
            first = re.sub(r"^.*?tempfile_\w+\.cl:", "line ", lines[0]) if lines else "build failed"
            raise CompileFailed(f"OpenCL build failed: {first}", log=log) from None

    def load(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        ctx, _ = self._context()
        start = time.perf_counter()
        program = self._build(cl.Program(ctx, source), self._options(defines, build_options))
        return self._module(program, time.perf_counter() - start)

    def _module(self, program: Any, elapsed: float, log: str | None = None) -> KernelModule:
        dev = self._cl_device()
        if log is None:
            log = (program.get_build_info(dev, cl.program_build_info.LOG) or "").strip()
        kernels: dict[str, Any] = {}
        resources: dict[str, Any] = {}
        try:  # the program binary's size (a statistic the behaviour descriptors report)
            binary_bytes: int | None = int(sum(program.get_info(cl.program_info.BINARY_SIZES)))
        except Exception:
            binary_bytes = None
        for kname in (n for n in program.kernel_names.split(";") if n):
            kernel = cl.Kernel(program, kname)
            resources[kname] = {**self._kernel_resources(kernel, dev), "binary_bytes": binary_bytes}
            launch = functools.partial(self.launch, kernel, max_wg=resources[kname]["max_work_group_size"])
            kernels[kname] = KernelLauncher(kname, launch)
        if not kernels:
            raise CompileFailed("OpenCL program defines no __kernel function", log=log)
        return KernelModule(kernels, resources=resources, compile_time_s=elapsed, log=log)

    # -- compile and load as separate steps (the compile service, its cache) ----------------------

    def artifact_target(self) -> str:
        """What a program binary is built for: the selected device and its driver."""
        dev = self.require_device()
        return f"{dev.key}; {dev.driver_version}"

    def compile_artifact(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
        target: str = "",
        device: str | int | None = None,
    ) -> tuple[bytes, dict[str, Any]]:
        """Build ``source`` for ``device`` in a context of its own: the program binary and its log."""
        self.select_device(device)
        dev = self._cl_device()
        start = time.perf_counter()
        program = self._build(cl.Program(cl.Context([dev]), source), self._options(defines, build_options))
        elapsed = time.perf_counter() - start
        log = (program.get_build_info(dev, cl.program_build_info.LOG) or "").strip()
        kernels = [n for n in program.kernel_names.split(";") if n]
        if not kernels:
            raise CompileFailed("OpenCL program defines no __kernel function", log=log)
        binary = bytes(program.get_info(cl.program_info.BINARIES)[0])
        return binary, {"log": log, "compile_time_s": elapsed, "kernels": kernels}

    def load_artifact(
        self,
        data: bytes,
        meta: dict[str, Any],
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        """A program from its binary (``clCreateProgramWithBinary``) on the selected device."""
        ctx, _ = self._context()
        start = time.perf_counter()
        program = self._build(
            cl.Program(ctx, [self._cl_device()], [data]), self._options(defines, build_options)
        )
        compile_s = float(meta.get("compile_time_s") or 0.0)
        return self._module(program, compile_s + time.perf_counter() - start, str(meta.get("log") or ""))

    @staticmethod
    def _kernel_resources(kernel: Any, dev: Any) -> dict[str, Any]:
        info = cl.kernel_work_group_info
        out: dict[str, Any] = {}
        for key, what in (
            ("max_work_group_size", info.WORK_GROUP_SIZE),
            ("local_mem_bytes", info.LOCAL_MEM_SIZE),
            ("private_mem_bytes", info.PRIVATE_MEM_SIZE),
            ("preferred_multiple", info.PREFERRED_WORK_GROUP_SIZE_MULTIPLE),
        ):
            try:
                out[key] = int(kernel.get_work_group_info(what, dev))
            except Exception:
                out[key] = None
        return out

    # -- run ------------------------------------------------------------------------------------

    def _buffer(self, tensor: torch.Tensor, zero_copy: bool) -> tuple[Any, Any]:
        if tensor.device.type != "cpu":
            raise LaunchError(f"opencl: tensor on {tensor.device}; kernel arguments must be CPU tensors")
        if not tensor.is_contiguous():
            raise LaunchError("opencl: tensor argument is not contiguous (call .contiguous() first)")
        if tensor.numel() == 0:
            raise LaunchError("opencl: empty tensor argument")
        # The tensor's own bytes through ctypes: no torch operator runs (none reaches a dispatch mode),
        # and the buffer aliases the tensor's memory, which the launch keeps alive until synchronize().
        host = (ctypes.c_uint8 * (tensor.numel() * tensor.element_size())).from_address(tensor.data_ptr())
        ctx, queue = self._context()
        mf = cl.mem_flags
        if zero_copy:
            return cl.Buffer(ctx, mf.READ_WRITE | mf.USE_HOST_PTR, hostbuf=host), None
        buf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
        return buf, host

    def _zero_copy_default(self) -> bool:
        """Wrap tensors in place on PoCL's CPU device (verified to use the host memory as is, aligned or
        not); other runtimes may shadow host memory, so they get copies."""
        dev = self.require_device()
        return dev.device_type == "cpu" and "Portable Computing Language" in str(
            dev.extra.get("platform", "")
        )

    def launch(
        self,
        kernel: Any,
        args: Sequence[Any],
        grid: int | Sequence[int],
        block: int | Sequence[int] | None,
        max_wg: int | None,
    ) -> None:
        """Launch ``kernel``: global size ``grid * block`` element-wise, local size ``block``."""
        _, queue = self._context()
        g = launch_dims(grid, "grid")
        b = launch_dims(block, "block")
        assert g is not None
        if b is not None:
            if len(b) != len(g):
                raise LaunchError(f"grid {g} and block {b} have different dimensions")
            size = int(np.prod(b))
            if max_wg is not None and size > max_wg:
                raise LaunchError(
                    f"work-group size {size} exceeds this kernel's limit {max_wg} on this device"
                )
            global_size = tuple(gi * bi for gi, bi in zip(g, b, strict=True))
        else:
            global_size = g
        import torch

        zero_copy = self._zero_copy()
        cl_args: list[Any] = []
        copies: list[tuple[Any, Any]] = []
        keep: list[Any] = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                buf, host = self._buffer(a, zero_copy)
                cl_args.append(buf)
                keep.append((buf, a))
                if host is not None:
                    copies.append((host, buf))
            elif isinstance(a, LocalMemory):
                cl_args.append(cl.LocalMemory(max(1, int(a.nbytes))))
            elif isinstance(a, (bool, int)):
                cl_args.append(np.int32(a))
            elif isinstance(a, float):
                cl_args.append(np.float32(a))
            elif isinstance(a, np.generic) or a is None:
                cl_args.append(a)
            else:
                raise LaunchError(f"kernel argument {i}: unsupported type {type(a).__name__}")
        try:
            kernel.set_args(*cl_args)
            cl.enqueue_nd_range_kernel(queue, kernel, global_size, b)
        except cl.Error as exc:
            raise LaunchError(f"opencl launch failed: {str(exc).splitlines()[0]}") from None
        for host, buf in copies:
            cl.enqueue_copy(queue, host, buf, is_blocking=False)
        self._keep(keep)

    def synchronize(self) -> None:
        if self._ctx is not None:
            self._ctx[1].finish()
        self._pending.clear()


class OpenCLHardware(HardwareDetector):
    """Hardware detector: one :class:`DeviceProfile` per OpenCL device, from ``clGetDeviceInfo``."""

    backends = ("opencl",)

    def __init__(self, options: NoOptions | None = None) -> None:
        self.options = options

    def detect(self, backend: str = "opencl") -> list[DeviceProfile]:
        return [profile_of(d, i) for i, d in enumerate(_all_devices())] if backend == "opencl" else []

    def unavailable_reason(self) -> str:
        return "" if _all_devices() else "no OpenCL platform/device (install pyopencl[pocl] for a CPU one)"


@hookimpl
def kf_register_backends(register: Any) -> None:
    register(
        "opencl", OpenCLBackend, options=OpenCLOptions, description="OpenCL via pyopencl (PoCL on the CPU)"
    )


@hookimpl
def kf_register_hardware(register: Any) -> None:
    register("opencl", OpenCLHardware, description="generic OpenCL device profile from clGetDeviceInfo")


@hookimpl
def kf_register_descriptors(register: Any) -> None:
    from kfoundry.core.behaviour.registry import register_descriptors

    register_descriptors(register, "opencl")


@hookimpl
def kf_register_languages(register: Any) -> None:
    from kfoundry.core.languages import LanguageSpec

    spec = LanguageSpec(
        name="opencl", suffixes=(".cl",), fences=("opencl", "cl", "c"), description="OpenCL C kernels"
    )
    register(spec.name, spec)
