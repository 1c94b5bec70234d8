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

Also registers the ``sycl`` hardware detector: a :class:`DeviceProfile` per device the runtime reports.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata as md
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from kfoundry import hookimpl
from kfoundry.core.backend import Backend, BackendCapabilities, BackendOptions, CompileFailed, KernelModule
from kfoundry.core.errors import BackendUnavailable, KfError
from kfoundry.core.hardware import HardwareDetector
from kfoundry.core.models import DeviceProfile, ParamValue
from kfoundry.core.peaks import with_peaks
from kfoundry.core.plugins import NoOptions
from kfoundry.runtime import LocalMemory

if TYPE_CHECKING:  # torch is imported where a launch needs it
    import torch

INSTALL_HINT = "sycl: install the sycl extra: pip install 'kfoundry[sycl]'"
WHEELS = ("intel-sycl-rt", "intel-opencl-rt", "intel-cmplr-lib-rt")
SHIM_SOURCE = Path(__file__).with_name("sycl_shim.cpp")


class LaunchError(KfError):
    """A kernel launch was malformed (wrong argument count or type, work-group size over the limit...)."""


class SyclOptions(BackendOptions):
    """Options of the SYCL backend."""

    zero_copy: bool | None = Field(
        default=None,
        description="pass tensor memory to kernels as is (None: where the device supports USM system "
        "allocations) instead of copying it through USM shared memory",
    )


# -- the runtime: wheels, shim, devices --------------------------------------------------------------


@dataclass
class _Runtime:
    """The wheels' files, the loaded shim and the devices it enumerated (one per process)."""

    lib_dir: Path
    include_dir: Path
    opencl_cpu: Path | None
    versions: dict[str, str]
    lib: Any = None
    devices: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


_lock = threading.RLock()
_runtime: _Runtime | None = None
_runtime_error: str | None = None


def _dist_file(dist_name: str, name: str, parent: str = "") -> Path | None:
    """The installed file ``name`` (under a folder ending in ``parent``) of distribution ``dist_name``."""
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == name and str(f.parent).replace("\\", "/").endswith(parent):
            path = Path(str(dist.locate_file(f))).resolve()
            if path.exists():
                return path
    return None


def _find_wheels() -> tuple[_Runtime | None, str]:
    missing = []
    versions: dict[str, str] = {}
    for name in WHEELS:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            missing.append(name)
    if missing:
        return None, f"{INSTALL_HINT} (missing: {', '.join(missing)})"
    libsycl = _dist_file("intel-sycl-rt", "libsycl.so")
    header = _dist_file("intel-sycl-rt", "sycl.hpp", "include/sycl")
    if libsycl is None or header is None:
        return (
            None,
            f"{INSTALL_HINT} (intel-sycl-rt {versions['intel-sycl-rt']} has no libsycl.so or sycl.hpp)",
        )
    opencl_cpu = _dist_file("intel-opencl-rt", "libintelocl.so")
    return _Runtime(libsycl.parent, header.parent.parent, opencl_cpu, versions), ""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kfoundry" / "sycl"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("KF_SYCL_CXX", "g++"))


def _build_shim(rt: _Runtime, cxx: str) -> Path:
    """The shim library, built with g++ unless the cache holds it already (raises RuntimeError)."""
    source = SHIM_SOURCE.read_bytes()
    try:
        cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        cxx_version = ""
    key = hashlib.sha256(
        source + json.dumps([rt.versions, str(rt.lib_dir), cxx_version.splitlines()[:1]]).encode()
    ).hexdigest()[:16]
    out = _cache_dir() / f"sycl_shim-{rt.versions['intel-sycl-rt']}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [
        cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-w",
        f"-I{rt.include_dir}", f"-I{rt.include_dir / 'sycl'}",
        str(SHIM_SOURCE), "-o", tmp,
        f"-L{rt.lib_dir}", "-lsycl", f"-Wl,-rpath,{rt.lib_dir}",
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"building the SYCL host shim failed: {' '.join(cmd)}\n{done.stderr[-4000:]}")
        os.replace(tmp, out)  # atomic: concurrent builders each write their own temporary file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _bind(lib: Any) -> None:
    vp, cp, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "kf_message": (cp, []),
        "kf_init": (i, []),
        "kf_device_info": (i, [i]),
        "kf_open": (vp, [i]),
        "kf_close": (None, [vp]),
        "kf_build": (vp, [vp, cp, i, ctypes.POINTER(cp)]),
        "kf_release_bundle": (None, [vp]),
        "kf_has_kernel": (i, [vp, cp]),
        "kf_get_kernel": (vp, [vp, cp]),
        "kf_release_kernel": (None, [vp]),
        "kf_kernel_info": (i, [vp, vp]),
        "kf_launch": (
            i,
            [
                vp,
                vp,
                i,
                ctypes.POINTER(sz),
                ctypes.POINTER(sz),
                i,
                ctypes.POINTER(i),
                ctypes.POINTER(ctypes.c_uint64),
            ],
        ),
        "kf_wait": (i, [vp]),
        "kf_malloc_shared": (vp, [vp, sz]),
        "kf_free": (None, [vp, vp]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


def _message(lib: Any) -> str:
    raw = lib.kf_message()
    return raw.decode(errors="replace") if raw else ""


def _start(rt: _Runtime) -> None:
    """Load the shim and enumerate devices; ``OCL_ICD_FILENAMES`` names the wheel's CPU runtime meanwhile."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("sycl: g++ is needed to build the SYCL host shim (apt-get install g++)")
    shim = _build_shim(rt, cxx)
    cache = _cache_dir() / "jit"
    os.environ.setdefault("SYCL_CACHE_PERSISTENT", "1")
    os.environ.setdefault("SYCL_CACHE_DIR", str(cache))
    previous = os.environ.get("OCL_ICD_FILENAMES")
    if rt.opencl_cpu is not None:
        os.environ["OCL_ICD_FILENAMES"] = os.pathsep.join(p for p in (previous, str(rt.opencl_cpu)) if p)
    try:
        lib = ctypes.CDLL(str(shim))
        _bind(lib)
        count = lib.kf_init()
        if count < 0:
            raise RuntimeError(f"sycl: the runtime found no platform: {_message(lib)}")
    finally:  # the ICD loader read it when the runtime enumerated platforms; later OpenCL users get theirs
        if previous is None:
            os.environ.pop("OCL_ICD_FILENAMES", None)
        else:
            os.environ["OCL_ICD_FILENAMES"] = previous
    devices = []
    for index in range(count):
        if lib.kf_device_info(index) == 0:
            info = json.loads(_message(lib))
            info["sycl_index"] = index
            if info.get("can_compile_sycl"):
                devices.append(info)
    rt.lib, rt.devices = lib, devices


def runtime() -> _Runtime:
    """The process's SYCL runtime, started on first use (raises :class:`BackendUnavailable` with the reason)."""
    global _runtime, _runtime_error
    with _lock:
        if _runtime is None and _runtime_error is None:
            rt, why = _find_wheels()
            if rt is None:
                _runtime_error = why
            else:
                try:
                    _start(rt)
                    _runtime = rt
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    _runtime_error = str(exc)
        if _runtime is None:
            raise BackendUnavailable(_runtime_error or "sycl: runtime unavailable")
        return _runtime


def unavailable_reason() -> str:
    """Why this machine cannot compile SYCL (empty when it can)."""
    try:
        rt = runtime()
    except BackendUnavailable as exc:
        return str(exc)
    if not rt.devices:
        where = (
            f" (OpenCL CPU runtime: {rt.opencl_cpu})"
            if rt.opencl_cpu
            else " (intel-opencl-rt has no libintelocl.so)"
        )
        return f"sycl: no device can compile SYCL source{where}"
    return ""


def profile_of(info: dict[str, Any], index: int) -> DeviceProfile:
    """A :class:`DeviceProfile` from what the SYCL runtime reports about one device."""
    return DeviceProfile(
        backend="sycl",
        name=str(info["name"]).strip(),
        index=index,
        vendor=str(info.get("vendor", "")).strip(),
        device_type=info.get("device_type", "other"),
        driver_version=f"{info.get('platform_version', '')}; driver {info.get('driver_version', '')}",
        compute_units=info.get("compute_units"),
        max_work_group_size=info.get("max_work_group_size"),
        max_work_item_sizes=info.get("max_work_item_sizes") or None,
        local_mem_bytes=info.get("local_mem_bytes"),
        global_mem_bytes=info.get("global_mem_bytes"),
        sub_group_sizes=info.get("sub_group_sizes") or None,
        preferred_vector_width_float=info.get("preferred_vector_width_float"),
        clock_mhz=float(info.get("clock_mhz") or 0) or None,
        l2_cache_bytes=info.get("l2_cache_bytes") or None,
        extra={
            "platform": info.get("platform", ""),
            "sycl_backend": info.get("backend", ""),
            "version": info.get("version", ""),
            "usm_system_allocations": bool(info.get("usm_system_allocations")),
            "usm_shared_allocations": bool(info.get("usm_shared_allocations")),
            "fp64": bool(info.get("fp64")),
            "fp16": bool(info.get("fp16")),
        },
    )


# -- source handling ----------------------------------------------------------------------------------

_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.MULTILINE)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_KERNEL = re.compile(
    r"SYCL_EXT_ONEAPI_FUNCTION_PROPERTY\s*\(\s*\(\s*[\w:]*?\b(nd_range_kernel|single_task_kernel)\s*"
    r"(?:<\s*(\d)\s*>)?\s*\)\s*\)[^;{}()]*?\bvoid\s+(\w+)\s*\("
)
_QUALIFIERS = {"const", "volatile", "restrict", "__restrict", "__restrict__", "struct"}
_SCALAR_KINDS: dict[str, str] = {
    "int": "i32", "signed": "i32", "signed int": "i32", "int32_t": "i32",
    "unsigned": "u32", "unsigned int": "u32", "uint32_t": "u32", "uint": "u32",
    "long": "i64", "long int": "i64", "long long": "i64", "long long int": "i64", "int64_t": "i64",
    "ptrdiff_t": "i64",
    "unsigned long": "u64", "unsigned long int": "u64", "unsigned long long": "u64", "uint64_t": "u64",
    "size_t": "u64",
    "short": "i16", "short int": "i16", "int16_t": "i16", "unsigned short": "u16", "uint16_t": "u16",
    "char": "i8", "signed char": "i8", "int8_t": "i8", "unsigned char": "u8", "uint8_t": "u8", "bool": "u8",
    "float": "f32", "double": "f64", "half": "f16", "sycl::half": "f16",
}  # fmt: skip
#: Argument kinds, numbered as in sycl_shim.cpp.
_KIND_CODE = {
    "ptr": 0, "i8": 1, "u8": 2, "i16": 3, "u16": 4, "i32": 5, "u32": 6, "i64": 7, "u64": 8,
    "f16": 9, "f32": 10, "f64": 11, "local": 12,
}  # fmt: skip
_INT_BITS = {"i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64}
_NUMPY_KIND = {
    "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32", "uint32": "u32",
    "int64": "i64", "uint64": "u64", "float16": "f16", "float32": "f32", "float64": "f64", "bool": "u8",
}  # fmt: skip


@dataclass(frozen=True)
class Param:
    """One kernel parameter as declared: ``kind`` is ptr / local / a scalar kind / None (unknown type)."""

    name: str
    type: str
    kind: str | None


@dataclass(frozen=True)
class KernelSignature:
    name: str
    ndim: int | None
    params: tuple[Param, ...]


def _define_value(value: ParamValue) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        if value != value:
            return '(__builtin_nanf(""))'
        if value in (float("inf"), float("-inf")):
            return "(__builtin_inff())" if value > 0 else "(-__builtin_inff())"
        return f"{value!r}f"
    return str(value)


def _insert_defines(source: str, defines: dict[str, ParamValue] | None) -> tuple[str, int, int]:
    """``source`` with the defines inserted, the line they start at and how many lines were inserted."""
    if not defines:
        return source, 0, 0
    lines = []
    for name, value in defines.items():
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise CompileFailed(f"sycl: define name {name!r} is not an identifier")
        lines.append(f"#define {name} {_define_value(value)}")
    includes = list(_INCLUDE.finditer(source))
    if not includes:
        return "\n".join(lines) + "\n" + source, 1, len(lines)
    at = includes[-1].end()
    first = source.count("\n", 0, at) + 2
    return source[:at] + "\n" + "\n".join(lines) + source[at:], first, len(lines)


def with_defines(source: str, defines: dict[str, ParamValue] | None) -> str:
    """``source`` with a ``#define`` line per entry after its last ``#include``."""
    return _insert_defines(source, defines)[0]


def _source_lines(log: str, first: int, count: int) -> str:
    """The compiler's line numbers mapped back to the source's (the runtime compiler ignores ``#line``)."""
    if not count:
        return log

    def fix(m: re.Match[str]) -> str:
        line = int(m.group(2))
        return f"{m.group(1)}{line - count if line >= first + count else line}"

    return re.sub(r"(rtc_\d+\.cpp:)(\d+)", fix, log)


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip() and p.strip() != "void"]


def _param(text: str, defines: dict[str, ParamValue]) -> Param:
    words = re.findall(r"[\w:]+", text.split("=")[0])
    name = words[-1] if len(words) > 1 else ""
    if "local_accessor" in text:
        return Param(name, text, "local")
    if "work_group_memory" in text:
        return Param(name, text, "unsupported")
    if "*" in text or "[" in text:
        return Param(name, text, "ptr")
    type_words = [w for w in (words[:-1] if name else words) if w not in _QUALIFIERS]
    type_words = [str(defines.get(w, w)) for w in type_words]
    type_name = " ".join(w.removeprefix("std::") for w in type_words)
    if "*" in type_name:
        return Param(name, text, "ptr")
    return Param(name, text, _SCALAR_KINDS.get(type_name))


def parse_kernels(source: str, defines: dict[str, ParamValue] | None = None) -> list[KernelSignature]:
    """The free-function kernels (``SYCL_EXT_ONEAPI_FUNCTION_PROPERTY``) declared in ``source``."""
    text = _COMMENT.sub(" ", source)
    out = []
    for m in _KERNEL.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        params = tuple(_param(p, defines or {}) for p in _split_params(text[m.end() : i - 1]))
        ndim = int(m.group(2)) if m.group(2) else (1 if m.group(1) == "single_task_kernel" else None)
        out.append(KernelSignature(m.group(3), ndim, params))
    return out


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if "error:" in line:
            return re.sub(r"^.*?rtc_\d+\.cpp:", "line ", line.strip())
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return lines[0] if lines else "build failed"


def _dims(value: int | Sequence[int] | None, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        dims = (int(value),) if not isinstance(value, Sequence) else tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise LaunchError(f"{what} must be 1-3 positive sizes, got {value!r}") from None
    if not 1 <= len(dims) <= 3 or any(d <= 0 for d in dims):
        raise LaunchError(f"{what} must be 1-3 positive sizes, got {value!r}")
    return dims


def _bits(kind: str, value: Any, where: str) -> int:
    """The 64-bit pattern the shim passes for scalar ``value`` of ``kind``."""
    if kind in _INT_BITS:
        bits = _INT_BITS[kind]
        v = int(value)
        lo, hi = (0, 2**bits - 1) if kind.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if not lo <= v <= hi:
            raise LaunchError(f"{where}: {v} does not fit the parameter's {kind}")
        return v & (2**bits - 1)
    fmt = {"f16": ("<e", "<H"), "f32": ("<f", "<I"), "f64": ("<d", "<Q")}[kind]
    try:
        packed = struct.pack(fmt[0], float(value))
    except OverflowError:
        raise LaunchError(f"{where}: {value} does not fit the parameter's {kind}") from None
    return int(struct.unpack(fmt[1], packed)[0])


# -- the backend --------------------------------------------------------------------------------------


class _Program:
    """A built program's native handles, released when its module is collected."""

    def __init__(self, lib: Any, bundle: int) -> None:
        self.kernels: dict[str, int] = {}
        self._finalizer = weakref.finalize(self, _release, lib, bundle, self.kernels)
        self._finalizer.atexit = False  # the runtime tears itself down at exit


def _release(lib: Any, bundle: int, kernels: dict[str, int]) -> None:
    for handle in kernels.values():
        lib.kf_release_kernel(handle)
    lib.kf_release_bundle(bundle)


class SyclBackend(Backend):
    """SYCL through the oneAPI run-time kernel compiler (see module docstring)."""

    name = "sycl"
    language = "sycl"
    torch_device = "cpu"

    def __init__(self, options: SyclOptions | None = None) -> None:
        super().__init__(options or SyclOptions())
        self.options: SyclOptions
        self._ctx: int | None = None
        self._pending: list[Any] = []

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

    def select_device(self, spec: str | int | None = None) -> DeviceProfile:
        self._close()
        return super().select_device(spec)

    def _close(self) -> None:
        if self._ctx is not None:
            self.synchronize()
            runtime().lib.kf_close(self._ctx)
            self._ctx = None

    def _context(self) -> int:
        if self._ctx is None:
            lib = runtime().lib
            info = self._info()
            ctx = lib.kf_open(int(info["sycl_index"]))
            if not ctx:
                raise BackendUnavailable(f"sycl: cannot open a queue on {info['name']}: {_message(lib)}")
            self._ctx = ctx
        return self._ctx

    def _zero_copy(self) -> bool:
        if self.options.zero_copy is not None:
            return self.options.zero_copy
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
        text, first, count = _insert_defines(source, defines)
        options = list(self.options.build_options) + list(build_options or [])
        c_options = (ctypes.c_char_p * max(1, len(options)))(*(o.encode() for o in options))
        start = time.perf_counter()
        bundle = lib.kf_build(ctx, text.encode(), len(options), c_options)
        elapsed = time.perf_counter() - start
        log = _source_lines(_message(lib).strip(), first, count)
        if not bundle:
            raise CompileFailed(f"SYCL build failed: {_first_error(log)}", log=log)
        program = _Program(lib, bundle)
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
            resources[sig.name] = json.loads(_message(lib) or "{}")
            num_args = resources[sig.name].get("num_args")
            plain = all(p.kind not in ("local", "unsupported", None) for p in sig.params)
            # num_args counts the lowered OpenCL arguments (an accessor becomes several): checked for plain
            # pointer/scalar signatures only, where a difference means the parse missed something
            if plain and isinstance(num_args, int) and num_args != len(sig.params):
                sig = KernelSignature(
                    sig.name, sig.ndim, tuple(Param(f"arg{i}", "?", None) for i in range(num_args))
                )
            kernels[sig.name] = _Launcher(
                self, program, handle, sig, resources[sig.name].get("max_work_group_size")
            )
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
        grid: int | Sequence[int],
        block: int | Sequence[int] | None,
        max_wg: int | None,
        keep: Any = None,
    ) -> None:
        """Launch ``kernel``: global size ``grid * block`` element-wise, local size ``block``."""
        lib = runtime().lib
        ctx = self._context()
        g = _dims(grid, "grid")
        b = _dims(block, "block")
        assert g is not None
        if b is not None and len(b) != len(g):
            raise LaunchError(f"grid {g} and block {b} have different dimensions")
        g3 = g + (1,) * (3 - len(g))
        b3 = (b or ()) + (1,) * (3 - len(b or ()))
        used = max([i + 1 for i in range(3) if g3[i] != 1 or b3[i] != 1] or [1])
        ndim = sig.ndim or used
        if used > ndim:
            raise LaunchError(
                f"kernel {sig.name} is an nd_range_kernel<{ndim}>: grid {g} and block {b} must be 1 past dimension {ndim}"
            )
        if b is not None and max_wg is not None and (size := b3[0] * b3[1] * b3[2]) > max_wg:
            raise LaunchError(f"work-group size {size} exceeds this kernel's limit {max_wg} on this device")
        if len(args) != len(sig.params):
            names = ", ".join(p.name or p.type for p in sig.params)
            raise LaunchError(
                f"kernel {sig.name} takes {len(sig.params)} arguments ({names}), got {len(args)}"
            )
        import torch

        zero_copy = self._zero_copy()
        kinds: list[int] = []
        values: list[int] = []
        tensors: list[torch.Tensor] = []
        copies: list[tuple[torch.Tensor, int, int]] = []
        try:
            for i, (a, p) in enumerate(zip(args, sig.params, strict=True)):
                where = f"kernel {sig.name} argument {i} ({p.name or p.type})"
                kind, value = self._arg(a, p, where, zero_copy, torch, copies)
                kinds.append(_KIND_CODE[kind])
                values.append(value)
                if isinstance(a, torch.Tensor):
                    tensors.append(a)
            glob = (ctypes.c_size_t * 3)(*(gi * bi for gi, bi in zip(g3, b3, strict=True)))
            local = (ctypes.c_size_t * 3)(*b3) if b is not None else None
            n = len(kinds)
            rc = lib.kf_launch(
                ctx, kernel, ndim, glob, local, n,
                (ctypes.c_int * max(1, n))(*kinds), (ctypes.c_uint64 * max(1, n))(*values),
            )  # fmt: skip
            if rc != 0:
                raise LaunchError(
                    f"sycl launch of {sig.name} failed: {_message(lib).strip().splitlines()[0]}"
                )
            if copies:  # copied arguments: wait, then copy every one back (the kernel may have written it)
                self.synchronize()
                for tensor, ptr, nbytes in copies:
                    ctypes.memmove(tensor.data_ptr(), ptr, nbytes)
        finally:
            for _, ptr, _ in copies:
                lib.kf_free(ctx, ptr)
        self._pending.append((tensors, keep))
        if len(self._pending) > 256:
            self.synchronize()

    def _arg(
        self, a: Any, p: Param, where: str, zero_copy: bool, torch: Any, copies: list[tuple[Any, int, int]]
    ) -> tuple[str, int]:
        if p.kind == "unsupported":
            raise LaunchError(
                f"{where}: work_group_memory parameters are not supported; take a sycl::local_accessor<T, 1> "
                "and pass LocalMemory(nbytes), or use syclexp::work_group_static<T[N]> in the kernel"
            )
        if isinstance(a, torch.Tensor):
            if p.kind not in ("ptr", None):
                raise LaunchError(f"{where}: a tensor for the non-pointer parameter {p.type!r}")
            if a.device.type != "cpu":
                raise LaunchError(f"{where}: tensor on {a.device}; kernel arguments must be CPU tensors")
            if not a.is_contiguous():
                raise LaunchError(f"{where}: tensor is not contiguous (call .contiguous() first)")
            if a.numel() == 0:
                raise LaunchError(f"{where}: empty tensor")
            if zero_copy:
                return "ptr", int(a.data_ptr())
            nbytes = a.numel() * a.element_size()
            lib = runtime().lib
            ptr = lib.kf_malloc_shared(self._context(), nbytes)
            if not ptr:
                raise LaunchError(f"{where}: USM shared allocation of {nbytes} bytes failed: {_message(lib)}")
            copies.append((a, ptr, nbytes))
            ctypes.memmove(ptr, a.data_ptr(), nbytes)
            return "ptr", int(ptr)
        if p.kind == "ptr":
            if a is None:
                return "ptr", 0
            raise LaunchError(
                f"{where}: the pointer parameter {p.type!r} needs a tensor, got {type(a).__name__}"
            )
        if isinstance(a, LocalMemory):
            if p.kind not in ("local", None):
                raise LaunchError(
                    f"{where}: LocalMemory for the parameter {p.type!r} (needs a sycl::local_accessor)"
                )
            return "local", max(1, int(a.nbytes))
        if p.kind == "local":
            raise LaunchError(
                f"{where}: the local_accessor parameter needs LocalMemory(nbytes), got {type(a).__name__}"
            )
        import numpy as np

        if isinstance(a, np.generic):
            kind = _NUMPY_KIND.get(a.dtype.name)
            if kind is None:
                raise LaunchError(f"{where}: unsupported numpy type {a.dtype.name}")
            if p.kind is not None and p.kind != kind:
                raise LaunchError(
                    f"{where}: numpy {a.dtype.name} for a parameter of type {p.type!r} ({p.kind})"
                )
            return kind, _bits(kind, a.item(), where)
        if isinstance(a, (bool, int)):
            kind = p.kind or "i32"
            return kind, _bits(kind, a, where)
        if isinstance(a, float):
            kind = p.kind or "f32"
            if kind in _INT_BITS:
                raise LaunchError(f"{where}: float {a!r} for the integer parameter {p.type!r}")
            return kind, _bits(kind, a, where)
        raise LaunchError(f"{where}: unsupported argument type {type(a).__name__}")

    def synchronize(self) -> None:
        if self._ctx is not None:
            lib = runtime().lib
            rc = lib.kf_wait(self._ctx)
            self._pending.clear()
            if rc != 0:
                raise LaunchError(f"sycl: a kernel failed: {_message(lib).strip()}")
        self._pending.clear()


class _Launcher:
    """``module.name(*args, grid=..., block=..., shared_mem=0)`` for one SYCL kernel."""

    def __init__(
        self, backend: SyclBackend, program: _Program, kernel: int, sig: KernelSignature, max_wg: int | None
    ) -> None:
        self._backend, self._program, self._kernel = backend, program, kernel
        self._sig, self._max_wg = sig, max_wg
        self.__name__ = sig.name

    @property
    def signature(self) -> KernelSignature:
        return self._sig

    def __call__(
        self,
        *args: Any,
        grid: int | Sequence[int],
        block: int | Sequence[int] | None = None,
        shared_mem: int = 0,
    ) -> None:
        if shared_mem:
            raise LaunchError(
                "sycl: shared_mem is not supported; pass LocalMemory(nbytes) to a sycl::local_accessor parameter"
            )
        self._backend.launch(self._kernel, self._sig, args, grid, block, self._max_wg, keep=self._program)


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
