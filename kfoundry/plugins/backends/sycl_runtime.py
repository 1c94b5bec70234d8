"""The SYCL runtime of the ``sycl`` extra's wheels: found, started once per process, its devices listed.

The wheels (``intel-sycl-rt``, ``intel-opencl-rt``, ``intel-cmplr-lib-rt``) carry the SYCL runtime,
its run-time compiler and Intel's OpenCL CPU runtime. Starting means building and loading the host
shim (:mod:`kfoundry.plugins.backends.sycl_shim`) and enumerating the devices that can compile SYCL
source. Process-wide effects: ``OCL_ICD_FILENAMES`` names the wheel's ``libintelocl.so`` while the
runtime enumerates platforms (then it is restored, so pyopencl's device list does not change), and
the runtime's persistent JIT cache is on (``SYCL_CACHE_PERSISTENT=1``, cache in
``~/.cache/kfoundry/sycl/jit``; set ``SYCL_CACHE_PERSISTENT=0`` to turn it off).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from importlib import metadata as md
from pathlib import Path
from typing import Any

from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.models import DeviceProfile
from kfoundry.plugins.backends.launch import device_profile
from kfoundry.plugins.backends.sycl_shim import bind, build_shim, cache_dir, compiler, message

INSTALL_HINT = "sycl: install the sycl extra: pip install 'kfoundry[sycl]'"
WHEELS = ("intel-sycl-rt", "intel-opencl-rt", "intel-cmplr-lib-rt")


@dataclass
class Runtime:
    """The wheels' files, the loaded shim and the devices it enumerated (one per process)."""

    lib_dir: Path
    include_dir: Path
    opencl_cpu: Path | None
    versions: dict[str, str]
    lib: Any = None
    devices: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


_lock = threading.RLock()
_runtime: Runtime | None = None
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


def find_wheels() -> tuple[Runtime | None, str]:
    """The installed wheels' files (not started yet), or None and why they cannot be used."""
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
    return Runtime(libsycl.parent, header.parent.parent, opencl_cpu, versions), ""


def start(rt: Runtime) -> None:
    """Load the shim and enumerate devices; ``OCL_ICD_FILENAMES`` names the wheel's CPU runtime meanwhile."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("sycl: g++ is needed to build the SYCL host shim (apt-get install g++)")
    shim = build_shim(rt.versions, rt.include_dir, rt.lib_dir, cxx)
    os.environ.setdefault("SYCL_CACHE_PERSISTENT", "1")
    os.environ.setdefault("SYCL_CACHE_DIR", str(cache_dir() / "jit"))
    previous = os.environ.get("OCL_ICD_FILENAMES")
    if rt.opencl_cpu is not None:
        os.environ["OCL_ICD_FILENAMES"] = os.pathsep.join(p for p in (previous, str(rt.opencl_cpu)) if p)
    try:
        lib = ctypes.CDLL(str(shim))
        bind(lib)
        count = lib.kf_init()
        if count < 0:
            raise RuntimeError(f"sycl: the runtime found no platform: {message(lib)}")
    finally:  # the ICD loader read it when the runtime enumerated platforms; later OpenCL users get theirs
        if previous is None:
            os.environ.pop("OCL_ICD_FILENAMES", None)
        else:
            os.environ["OCL_ICD_FILENAMES"] = previous
    devices = []
    for index in range(count):
        if lib.kf_device_info(index) == 0:
            info = json.loads(message(lib))
            info["sycl_index"] = index
            if info.get("can_compile_sycl"):
                devices.append(info)
    rt.lib, rt.devices = lib, devices


def runtime() -> Runtime:
    """The process's SYCL runtime, started on first use (raises :class:`BackendUnavailable` with the reason)."""
    global _runtime, _runtime_error
    with _lock:
        if _runtime is None and _runtime_error is None:
            rt, why = find_wheels()
            if rt is None:
                _runtime_error = why
            else:
                try:
                    start(rt)
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
    return device_profile(
        "sycl",
        index,
        {**info, "l2_cache_bytes": info.get("l2_cache_bytes") or None},
        driver_version=f"{info.get('platform_version', '')}; driver {info.get('driver_version', '')}",
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
