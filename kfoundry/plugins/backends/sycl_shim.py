"""The SYCL host shim: ``sycl_shim.cpp`` built with g++ against the wheel's ``libsycl.so`` and its
C functions declared for ctypes.

The library is cached in ``~/.cache/kfoundry/sycl/``, keyed by the shim source, the runtime versions,
the runtime's folder and the compiler's version line (``KF_SYCL_CXX`` names another compiler).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SHIM_SOURCE = Path(__file__).with_name("sycl_shim.cpp")


def cache_dir() -> Path:
    """Where the shim and the runtime's persistent JIT cache live."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kfoundry" / "sycl"


def compiler() -> str | None:
    """The host C++ compiler (``KF_SYCL_CXX``, default g++), or None where there is none."""
    return shutil.which(os.environ.get("KF_SYCL_CXX", "g++"))


def build_shim(
    versions: dict[str, str], include_dir: Path, lib_dir: Path, cxx: str, opencl: bool | None = None
) -> Path:
    """The shim library, built with ``cxx`` unless the cache holds it already (raises RuntimeError).

    ``opencl`` (default: where the wheel's ``libOpenCL.so`` sits beside libsycl) links the OpenCL ICD
    loader for the kernels' local memory; a build that fails with it is retried without."""
    if opencl is None:
        opencl = (lib_dir / "libOpenCL.so").exists()
    if opencl:
        try:
            return _build(versions, include_dir, lib_dir, cxx, True)
        except RuntimeError:
            pass
    return _build(versions, include_dir, lib_dir, cxx, False)


def _build(versions: dict[str, str], include_dir: Path, lib_dir: Path, cxx: str, with_opencl: bool) -> Path:
    source = SHIM_SOURCE.read_bytes()
    try:
        cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        cxx_version = ""
    # the wheel's OpenCL ICD loader (clGetKernelWorkGroupInfo) needs the wheel's libsvml & co, which only an
    # old-style RPATH (searched for dependencies of dependencies, unlike RUNPATH) finds without LD_LIBRARY_PATH
    opencl = ["-DKF_HAVE_OPENCL", "-lOpenCL", "-Wl,--disable-new-dtags"] if with_opencl else []
    key = hashlib.sha256(
        source + json.dumps([versions, str(lib_dir), cxx_version.splitlines()[:1], opencl]).encode()
    ).hexdigest()[:16]
    out = cache_dir() / f"sycl_shim-{versions['intel-sycl-rt']}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [
        cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-w",
        f"-I{include_dir}", f"-I{include_dir / 'sycl'}",
        str(SHIM_SOURCE), "-o", tmp,
        f"-L{lib_dir}", "-lsycl", *opencl, f"-Wl,-rpath,{lib_dir}",
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


def bind(lib: Any) -> None:
    """Declare the shim's C functions (result and argument types) on the loaded library."""
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
        "kf_image_count": (i, [vp]),
        "kf_image_content": (vp, [vp, i, ctypes.POINTER(sz)]),
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


def image_contents(lib: Any, bundle: int) -> list[bytes]:
    """The backend content of each device image of a built bundle (SPIR-V on the OpenCL backend).

    Raises RuntimeError with the runtime's message where the content cannot be read."""
    count = lib.kf_image_count(bundle)
    if count < 0:
        raise RuntimeError(f"sycl: cannot list the bundle's device images: {message(lib)}")
    out = []
    for index in range(count):
        size = ctypes.c_size_t(0)
        ptr = lib.kf_image_content(bundle, index, ctypes.byref(size))
        if not ptr:
            raise RuntimeError(f"sycl: cannot read device image {index}'s backend content: {message(lib)}")
        out.append(ctypes.string_at(ptr, size.value))
    return out


def message(lib: Any) -> str:
    """The shim's last message: a JSON report, or the text of the last error."""
    raw = lib.kf_message()
    return raw.decode(errors="replace") if raw else ""
