"""CUDA C++ to cubin: NVRTC (fast, in-process) or nvcc (fallback), with ptxas's resource report.

Both paths build machine code (cubin) for one architecture, so the driver never JIT-compiles PTX
(a newer NVRTC's PTX is refused by an older driver; its cubin is not). ``sm_90a`` is chosen
automatically on compute capability 9.0 when the source uses wgmma or setmaxnreg.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kfoundry.core.backend import CompileFailed
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.models import ParamValue
from kfoundry.plugins.backends.cuda_headers import HEADERS, PRELUDE_NAME
from kfoundry.plugins.backends.toolchain import define_flags, first_error, kernel_short_name, run_compiler

Compiler = Literal["auto", "nvrtc", "nvcc"]

#: Source features that need the architecture-specific ("a") target on Hopper.
_ARCH_SPECIFIC = re.compile(r"\bwgmma\b|\bsetmaxnreg\b|\bfence\.proxy\.async\b.*wgmma")

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")
_BARRIERS = re.compile(r"used (\d+) barriers")


@dataclass
class CompileResult:
    """A compiled program: machine code, the compiler's log and a per-kernel resource report."""

    cubin: bytes
    arch: str
    compiler: str
    log: str
    compile_time_s: float
    resources: dict[str, dict[str, int]] = field(default_factory=dict)
    #: The PTX NVRTC emitted on the way (empty from nvcc); read by the measured behaviour descriptors.
    ptx: str = ""


def parse_ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """Registers, shared/constant memory, stack frame, spills and barriers per entry function."""
    report: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in log.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            current = report.setdefault(kernel_short_name(entry.group(1)), {})
            continue
        if current is None:
            continue
        frame = _FRAME.search(line)
        if frame:
            current["stack_bytes"], current["spill_stores"], current["spill_loads"] = map(int, frame.groups())
        for key, pattern in (
            ("registers", _USED),
            ("shared_bytes", _SMEM),
            ("const_bytes", _CMEM),
            ("barriers", _BARRIERS),
        ):
            found = pattern.search(line)
            if found:
                current[key] = int(found.group(1))
    return report


def choose_arch(compute_capability: str | None, source: str) -> str:
    """``sm_XY`` for a compute capability "X.Y" (default 9.0), ``sm_90a`` when Hopper-only code is used."""
    major, minor = (compute_capability or "9.0").split(".")
    arch = f"sm_{major}{minor}"
    if arch == "sm_90" and _ARCH_SPECIFIC.search(source):
        arch = "sm_90a"
    return arch


def cuda_include_dirs() -> list[str]:
    """Toolkit include folders for headers such as ``cuda_fp16.h`` (CUDA_HOME, then nvcc's home)."""
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    found = []
    for root in roots:
        inc = Path(root) / "include" if root else None
        if inc and (inc / "cuda_runtime.h").is_file() and str(inc) not in found:
            found.append(str(inc))
            if (inc / "cccl").is_dir():  # CUDA 13 keeps cuda/std, cub and thrust here
                found.append(str(inc / "cccl"))
    return found


def nvrtc_available() -> tuple[bool, str]:
    """Whether NVRTC can be used, with the reason if not."""
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # missing wheel or library
        return False, f"NVRTC not usable ({type(exc).__name__}: {exc}); pip install 'kfoundry[cuda]'"
    if int(err) != 0:
        return False, f"NVRTC not usable (nvrtcVersion error {err})"
    return True, f"nvrtc {major}.{minor}"


def nvcc_version() -> str | None:
    """``nvcc 13.0.88`` or None when nvcc is not on the PATH."""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"V(\d+\.\d+\.\d+)", out)
    return f"nvcc {found.group(1)}" if found else "nvcc"


def _nvrtc_check(result: Any, what: str) -> None:
    code = result[0] if isinstance(result, tuple) else result
    if int(code) != 0:
        raise CompileFailed(f"NVRTC {what} failed: {code}")


def compile_nvrtc(source: str, arch: str, options: list[str]) -> CompileResult:
    """Compile with NVRTC to a cubin for ``arch``; raise :class:`CompileFailed` with the log."""
    from cuda.bindings import nvrtc

    started = time.perf_counter()
    names = list(HEADERS)
    err, prog = nvrtc.nvrtcCreateProgram(
        source.encode(),
        b"candidate.cu",
        len(names),
        [HEADERS[n].encode() for n in names],
        [n.encode() for n in names],
    )
    _nvrtc_check(err, "create program")
    try:
        flags = [f"--gpu-architecture={arch}", "--std=c++17", "-Xptxas=-v", f"--pre-include={PRELUDE_NAME}"]
        flags += [f"-I{inc}" for inc in cuda_include_dirs()] + options
        encoded = [f.encode() for f in flags]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _nvrtc_check(err, "get log size")
        log = ""
        if size > 1:  # a fresh buffer: never a shared one-byte bytes object (the binding writes into it)
            buf = bytes(bytearray(size))
            nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.rstrip(b"\x00 ").decode(errors="replace")
        if int(status) != 0:
            raise CompileFailed(first_error(log) or f"NVRTC compile failed: {status}", log=log)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _nvrtc_check(err, "get cubin size")
        cubin = bytes(bytearray(size))
        _nvrtc_check(nvrtc.nvrtcGetCUBIN(prog, cubin), "get cubin")
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = bytes(bytearray(size)) if int(err) == 0 and size > 1 else b""
        if ptx:
            nvrtc.nvrtcGetPTX(prog, ptx)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    elapsed = time.perf_counter() - started
    text = ptx.rstrip(b"\x00").decode(errors="replace")
    return CompileResult(cubin, arch, "nvrtc", log, elapsed, parse_ptxas_report(log), ptx=text)


def compile_nvcc(source: str, arch: str, options: list[str], timeout_s: float = 300.0) -> CompileResult:
    """Compile with nvcc (``-cubin``) to a cubin for ``arch``; raise :class:`CompileFailed` with the log."""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        raise BackendUnavailable("cuda: nvcc is not on the PATH")
    target = f"-gencode=arch=compute_{arch[3:]},code={arch}"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kf-nvcc-") as tmp:
        src = Path(tmp) / "candidate.cu"
        out = Path(tmp) / "candidate.cubin"
        src.write_text(source)
        cmd = [nvcc, "-cubin", target, "-std=c++17", "-Xptxas", "-v", *options, "-o", str(out), str(src)]
        cubin, log = run_compiler("nvcc", cmd, out, timeout_s)
    elapsed = time.perf_counter() - started
    return CompileResult(cubin, arch, "nvcc", log, elapsed, parse_ptxas_report(log))


def compile_cuda(
    source: str,
    *,
    arch: str,
    compiler: Compiler = "auto",
    defines: dict[str, ParamValue] | None = None,
    options: list[str] | None = None,
) -> CompileResult:
    """Compile ``source`` for ``arch`` with the chosen compiler (``auto``: NVRTC, else nvcc)."""
    flags = define_flags(defines) + list(options or [])
    if compiler == "auto":
        compiler = "nvrtc" if nvrtc_available()[0] else "nvcc"
    if compiler == "nvrtc":
        ok, why = nvrtc_available()
        if not ok:
            raise BackendUnavailable(f"cuda: {why}")
        return compile_nvrtc(source, arch, flags)
    return compile_nvcc(source, arch, flags)
