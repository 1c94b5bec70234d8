"""The SYCL backend: SYCL source compiled at run time by the oneAPI kernel compiler, on the Intel OpenCL CPU device.

No SYCL compiler (icpx) is needed: the pip wheels of the ``sycl`` extra (``intel-sycl-rt``,
``intel-opencl-rt``, ``intel-cmplr-lib-rt``) carry the SYCL runtime, its run-time compiler
(``sycl_ext_oneapi_kernel_compiler``, ``source_language::sycl``) and Intel's OpenCL CPU runtime. A small
C++ host shim (``sycl_shim.cpp``) is built with g++ on first use into ``~/.cache/kfoundry/sycl/``
(keyed by the shim source, the runtime versions and the compiler) and loaded with ctypes.

Kernels are free functions with C linkage (the convention of the SYCL prompts)::

    extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
    void add(const float* a, const float* b, float* c, int n) { ... }

launched as ``module.add(a, b, c, n, grid=(gx, 1, 1), block=(bx, 1, 1))``: global size ``grid * block``
element-wise, local size ``block``, dimension ``i`` of the launch is SYCL dimension ``i`` (the last one
varies fastest), dimensions past the kernel's ``nd_range_kernel<N>`` must be 1. Tensor arguments are
CPU torch tensors, passed as raw pointers with no copy where the device supports USM system allocations
(the Intel OpenCL CPU device does); elsewhere they are copied into USM shared memory and back around
each launch (which then waits for the kernel). Scalars take the type the kernel declares (parsed from
the source), else the contract's: Python ints as int32, floats as float32; numpy scalars keep their type.
``LocalMemory(nbytes)`` fills a ``sycl::local_accessor<T, 1>`` parameter; static work-group memory is
``syclexp::work_group_static<T[N]>``. (``get_work_group_scratch_memory()`` crashes this runtime compiler.)

Template parameters become ``#define`` lines inserted after the source's last ``#include`` (a ``-D`` on
the command line would also rewrite identifiers inside the SYCL headers: ``-DWG=64`` breaks them); the
log's line numbers are mapped back to the source's (this compiler ignores ``#line``).

Process-wide effects: the first use points the OpenCL ICD loader of the wheel at its ``libintelocl.so``
(``OCL_ICD_FILENAMES``, set for the runtime's start and then restored, so pyopencl's device list does
not change) and turns on the runtime's persistent JIT cache (``SYCL_CACHE_PERSISTENT=1``, cache in
``~/.cache/kfoundry/sycl/jit``; set ``SYCL_CACHE_PERSISTENT=0`` to turn it off): recompiling a known
source with known defines takes ~0.2 s instead of ~2 s.

Also registers the ``sycl`` hardware detector: a :class:`DeviceProfile` per device the runtime reports,
and the measured descriptors (:mod:`kfoundry.core.behaviour.measure_sycl`: the device image's SPIR-V
from :mod:`.sycl_artefact`, read by :mod:`kfoundry.core.behaviour.spirv`). Each kernel's report adds
the runtime's local memory (``clGetKernelWorkGroupInfo``) and the images' size (``binary_bytes``).

The parts: :mod:`.sycl_runtime` (the wheels, start-up, devices), :mod:`.sycl_shim` (the g++ host shim
and its ctypes table), :mod:`.sycl_source` (defines, kernel signatures, the log's lines),
:mod:`.sycl_launch` (launch geometry, argument marshalling), :mod:`.launch` (what OpenCL shares), and
this module: the backend, the hardware detector, the hooks.
"""

from __future__ import annotations

import ctypes
import functools
import json
import time
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from kfoundry import hookimpl
from kfoundry.core.backend import BackendCapabilities, BackendOptions, CompileFailed, KernelModule
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.hardware import HardwareDetector
from kfoundry.core.models import DeviceProfile, ParamValue
from kfoundry.core.peaks import with_peaks
from kfoundry.core.plugins import NoOptions
from kfoundry.plugins.backends.launch import Dims, KernelLauncher, LaunchError, QueueBackend
from kfoundry.plugins.backends.sycl_launch import Marshalled, Program, geometry, marshal
from kfoundry.plugins.backends.sycl_runtime import INSTALL_HINT, profile_of, runtime, unavailable_reason
from kfoundry.plugins.backends.sycl_shim import image_contents, message
from kfoundry.plugins.backends.sycl_source import (
    KernelSignature,
    Param,
    first_error,
    insert_defines,
    parse_kernels,
    source_lines,
    with_defines,
)

__all__ = [  # the names tests and tools import from here (several live in the sycl_* modules)
    "INSTALL_HINT",
    "KernelSignature",
    "LaunchError",
    "Param",
    "SyclBackend",
    "SyclHardware",
    "SyclOptions",
    "parse_kernels",
    "profile_of",
    "runtime",
    "unavailable_reason",
    "with_defines",
]

NO_SHARED_MEM = (
    "sycl: shared_mem is not supported; pass LocalMemory(nbytes) to a sycl::local_accessor parameter"
)


class SyclOptions(BackendOptions):
    """Options of the SYCL backend."""

    zero_copy: bool | None = Field(
        default=None,
        description="pass tensor memory to kernels as is (None: where the device supports USM system "
        "allocations) instead of copying it through USM shared memory",
    )


class SyclBackend(QueueBackend[int]):
    """SYCL through the oneAPI run-time kernel compiler (see module docstring)."""

    name = "sycl"
    language = "sycl"
    torch_device = "cpu"

    def __init__(self, options: SyclOptions | None = None) -> None:
        super().__init__(options or SyclOptions())
        self.options: SyclOptions

    # -- discovery ------------------------------------------------------------------------------

    def capabilities(self) -> BackendCapabilities:
        why = unavailable_reason()
        if why:
            return BackendCapabilities(can_compile=False, can_run=False, reason=why)
        return BackendCapabilities(can_compile=True, can_run=True)

    def _raw_devices(self) -> list[dict[str, Any]]:
        try:
            return runtime().devices
        except BackendUnavailable:
            return []

    def devices(self) -> list[DeviceProfile]:
        """Every device that can compile SYCL source, peak rates filled in where measured."""
        return [with_peaks(profile_of(d, i)) for i, d in enumerate(self._raw_devices())]

    def _info(self) -> dict[str, Any]:
        return self._raw_devices()[self.require_device().index]

    def toolchain_version(self) -> str:
        rt = runtime()
        info = self._info()
        wheels = "; ".join(f"{k} {v}" for k, v in rt.versions.items())
        return f"{wheels}; {info.get('platform_version', '')}; driver {info.get('driver_version', '')}"

    # -- context --------------------------------------------------------------------------------

    def _close(self) -> None:
        if self._ctx is not None:
            self.synchronize()
            runtime().lib.kf_close(self._ctx)
            self._ctx = None

    def _open(self) -> int:
        lib = runtime().lib
        info = self._info()
        ctx = lib.kf_open(int(info["sycl_index"]))
        if not ctx:
            raise BackendUnavailable(f"sycl: cannot open a queue on {info['name']}: {message(lib)}")
        return int(ctx)

    def _zero_copy_default(self) -> bool:
        return bool(self._info().get("usm_system_allocations"))

    # -- compile --------------------------------------------------------------------------------

    def load(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        lib = runtime().lib
        ctx = self._context()
        text, first, count = insert_defines(source, defines)
        options = list(self.options.build_options) + list(build_options or [])
        c_options = (ctypes.c_char_p * max(1, len(options)))(*(o.encode() for o in options))
        start = time.perf_counter()
        bundle = lib.kf_build(ctx, text.encode(), len(options), c_options)
        elapsed = time.perf_counter() - start
        log = source_lines(message(lib).strip(), first, count)
        if not bundle:
            raise CompileFailed(f"SYCL build failed: {first_error(log)}", log=log)
        program = Program(lib, bundle)
        try:  # the device images' backend content (SPIR-V on the OpenCL backend): its size in the report
            binary_bytes: int | None = sum(len(image) for image in image_contents(lib, bundle))
        except RuntimeError:
            binary_bytes = None
        kernels: dict[str, Any] = {}
        resources: dict[str, Any] = {}
        missing = []
        for sig in parse_kernels(source, defines):
            if lib.kf_has_kernel(bundle, sig.name.encode()) != 1:
                missing.append(sig.name)
                continue
            handle = lib.kf_get_kernel(bundle, sig.name.encode())
            if not handle:
                missing.append(sig.name)
                continue
            program.kernels[sig.name] = handle
            lib.kf_kernel_info(ctx, handle)
            resources[sig.name] = json.loads(message(lib) or "{}")
            if binary_bytes is not None:
                resources[sig.name]["binary_bytes"] = binary_bytes
            num_args = resources[sig.name].get("num_args")
            plain = all(p.kind not in ("local", "unsupported", None) for p in sig.params)
            # num_args counts the lowered OpenCL arguments (an accessor becomes several): checked for plain
            # pointer/scalar signatures only, where a difference means the parse missed something
            if plain and isinstance(num_args, int) and num_args != len(sig.params):
                sig = KernelSignature(
                    sig.name, sig.ndim, tuple(Param(f"arg{i}", "?", None) for i in range(num_args))
                )
            max_wg = resources[sig.name].get("max_work_group_size")
            launch = functools.partial(self.launch, handle, sig, max_wg=max_wg, keep=program)
            kernels[sig.name] = KernelLauncher(sig.name, launch, signature=sig, no_shared_mem=NO_SHARED_MEM)
        if missing:
            log += f'\nkfoundry: kernels not found in the program (declare them extern "C"): {", ".join(missing)}'
        if not kernels:
            raise CompileFailed(
                'SYCL program defines no extern "C" free-function kernel '
                "(SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>)))",
                log=log,
            )
        return KernelModule(kernels, resources=resources, compile_time_s=elapsed, log=log)

    # -- run ------------------------------------------------------------------------------------

    def launch(
        self,
        kernel: int,
        sig: KernelSignature,
        args: Sequence[Any],
        grid: Dims,
        block: Dims | None,
        max_wg: int | None,
        keep: Any = None,
    ) -> None:
        """Launch ``kernel``: global size ``grid * block`` element-wise, local size ``block``."""
        lib = runtime().lib
        ctx = self._context()
        shape = geometry(sig, grid, block, max_wg, len(args))
        out = Marshalled()
        try:
            marshal(lib, ctx, sig, args, self._zero_copy(), out)
            glob = (ctypes.c_size_t * 3)(*shape.global_size)
            local = (ctypes.c_size_t * 3)(*shape.local_size) if shape.local_size is not None else None
            n = len(out.kinds)
            rc = lib.kf_launch(
                ctx, kernel, shape.ndim, glob, local, n,
                (ctypes.c_int * max(1, n))(*out.kinds), (ctypes.c_uint64 * max(1, n))(*out.values),
            )  # fmt: skip
            if rc != 0:
                raise LaunchError(f"sycl launch of {sig.name} failed: {message(lib).strip().splitlines()[0]}")
            # copied arguments: wait, then copy every one back (the kernel may have written it)
            if out.copies:
                self.synchronize()
                for tensor, ptr, nbytes in out.copies:
                    ctypes.memmove(tensor.data_ptr(), ptr, nbytes)
        finally:
            for _, ptr, _ in out.copies:
                lib.kf_free(ctx, ptr)
        self._keep((out.tensors, keep))

    def synchronize(self) -> None:
        if self._ctx is not None:
            lib = runtime().lib
            rc = lib.kf_wait(self._ctx)
            self._pending.clear()
            if rc != 0:
                raise LaunchError(f"sycl: a kernel failed: {message(lib).strip()}")
        self._pending.clear()


class SyclHardware(HardwareDetector):
    """Hardware detector: one :class:`DeviceProfile` per device the SYCL runtime can compile SYCL source for."""

    backends = ("sycl",)

    def __init__(self, options: NoOptions | None = None) -> None:
        self.options = options

    def detect(self, backend: str = "sycl") -> list[DeviceProfile]:
        if backend != "sycl" or unavailable_reason():
            return []
        return [profile_of(d, i) for i, d in enumerate(runtime().devices)]

    def unavailable_reason(self) -> str:
        return unavailable_reason()


@hookimpl
def kf_register_backends(register: Any) -> None:
    register(
        "sycl",
        SyclBackend,
        options=SyclOptions,
        description="SYCL via the oneAPI run-time kernel compiler (pip wheels; Intel OpenCL CPU device)",
    )


@hookimpl
def kf_register_hardware(register: Any) -> None:
    register("sycl", SyclHardware, description="SYCL device profile from the oneAPI runtime")


@hookimpl
def kf_register_descriptors(register: Any) -> None:
    from kfoundry.core.behaviour.registry import register_descriptors

    register_descriptors(register, "sycl")


@hookimpl
def kf_register_languages(register: Any) -> None:
    from kfoundry.core.languages import LanguageSpec

    spec = LanguageSpec(
        name="sycl", suffixes=(".cpp", ".sycl"), fences=("sycl", "c++", "cpp"), description="SYCL C++ kernels"
    )
    register(spec.name, spec)
