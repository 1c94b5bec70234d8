"""What native code a candidate built and loaded, and whether it computes with a library.

The Python guard sees torch operators called from Python; a compiled extension (``load_inline``, a
``ctypes``-loaded ``.so``, NVRTC host code) calls ATen, cuBLAS or cuDNN from C++ where that guard is
blind. So the judge reads the runner's memory map itself (the runner is frozen, nothing it says is
asked), takes every executable mapping that is not part of the installation (the candidate can only
write into its scratch directory or a memfd), and reads that file's dynamic symbol table with
pyelftools, through ``/proc/<pid>/map_files`` so mount namespaces do not matter. Undefined symbols
that compute (ATen operators other than allocation and views, cuBLAS, cuDNN, cuFFT, cuSPARSE,
cuSOLVER) are the same offence as ``torch.matmul`` in a forward; so are those names in the file's
strings, and importing ``dlsym`` (or the driver's entry-point lookup) at all: a name assembled at run
time leaves neither symbol nor string.
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from kfoundry.core.evaluation.confine_plan import SCRATCH
from kfoundry.core.evaluation.guard import ALLOWED_OPS

#: Library prefixes whose functions compute (called from a candidate's own native code).
LIBRARY_PREFIXES = ("cublas", "cublasLt", "cudnn", "cufft", "cusparse", "cusolver", "cutensor", "nvblas")
#: ``at::_ops::<name>::call`` (and ``redispatch``) in Itanium mangling.
_ATEN_OP = re.compile(r"_ZN2at4_ops(\d+)([A-Za-z0-9_]+)")
_ATEN_NATIVE = re.compile(r"_ZN2at6native")
#: A symbol-like name in a file's strings (for ``dlsym`` lookups by name).
_STRINGS = re.compile(rb"(?:cublas|cudnn|cufft|cusparse|cusolver|cutensor)[A-Za-z0-9_]{2,60}")
_SYSTEM_PREFIXES = ("/usr/", "/lib/", "/lib64/", "/opt/", "/etc/", "/bin/", "/sbin/", "/snap/")


def _installation_prefixes() -> tuple[str, ...]:
    roots = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
        *site.getsitepackages(),
    }
    # the import path too (PYTHONPATH, a --target install): bound read-only into the runner, never written
    roots |= {p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)}
    resolved = {str(Path(r).resolve()) for r in roots if r}
    return tuple(sorted(r + "/" for r in resolved if r not in ("/", "/tmp", SCRATCH))) + _SYSTEM_PREFIXES


def _op_name(match: re.Match[str]) -> str:
    length, rest = int(match.group(1)), match.group(2)
    return rest[:length]


#: Run-time lookup of functions by name: a name put together at run time leaves no symbol or string to
#: read, and honest extensions (pybind11 bindings, kernels, torch's own headers) never need it.
LOOKUP_SYMBOLS = ("dlsym", "dlvsym", "cuGetProcAddress", "cuGetProcAddress_v2", "cudaGetDriverEntryPoint")
#: ATen's handles to cuBLAS / cuDNN (``at::cuda::getCurrentCUDABlasHandle``): no ``at::_ops`` in the name.
_ATEN_LIBRARY_HANDLE = re.compile(
    r"_ZN2at(4cuda|6native)[0-9]+getCurrent(CUDABlas|CUDABlasLt|CUDNN|CudnnHandle)"
)


#: Where Triton builds its own launcher stubs (which look libcuda's functions up with dlsym).
_TRITON_CACHE = "/.triton/cache/"


def offending_symbols(names: list[str], lookups_allowed: bool = False) -> list[str]:
    """The names among ``names`` that call computing library code (demangled enough to read)."""
    bad: list[str] = []
    for name in names:
        if (name in LOOKUP_SYMBOLS and not lookups_allowed) or _ATEN_LIBRARY_HANDLE.search(name):
            bad.append(name)
            continue
        if name.startswith(LIBRARY_PREFIXES):
            bad.append(name)
            continue
        op = _ATEN_OP.search(name)
        if op is not None:
            base = _op_name(op).split("__")[0]
            plain = re.sub(r"_(out|Tensor|Scalar|int|dim|memory_format|self|other|input)$", "", base)
            if base not in ALLOWED_OPS and plain not in ALLOWED_OPS and base.rstrip("_") not in ALLOWED_OPS:
                bad.append(f"at::{base}")
            continue
        if _ATEN_NATIVE.search(name):
            bad.append(name[:80])
    return list(dict.fromkeys(bad))


@dataclass
class Mapping:
    start: str
    end: str
    path: str


def candidate_libraries(pid: int) -> list[Mapping]:
    """Executable file mappings of ``pid`` outside the installation (first mapping of each file)."""
    trusted = _installation_prefixes()
    seen: set[str] = set()
    found: list[Mapping] = []
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        path = parts[5].strip()
        if not path.startswith("/") and not path.startswith("/memfd:"):
            continue  # [vdso], [stack], anonymous
        if path.startswith(trusted) and not path.endswith("(deleted)"):
            continue
        if path in seen:
            continue
        seen.add(path)
        start, end = parts[0].split("-")
        found.append(Mapping(start, end, path))
    return found


def _symbols(data_path: str) -> tuple[list[str], bytes]:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    names: list[str] = []
    with open(data_path, "rb") as handle:
        raw = handle.read(256 << 20)
    try:
        with open(data_path, "rb") as handle:
            elf = ELFFile(handle)
            for section in elf.iter_sections():
                if isinstance(section, SymbolTableSection) and section.name == ".dynsym":
                    names.extend(
                        s.name for s in section.iter_symbols() if s.name and s["st_shndx"] == "SHN_UNDEF"
                    )
    except (ELFError, ValueError, OSError):
        pass
    return names, raw


@dataclass
class Inspection:
    """What was inspected, and the first offence found (None: nothing computes through a library)."""

    libraries: list[str] = field(default_factory=list)
    offence: str | None = None
    unreadable: list[str] = field(default_factory=list)


def inspect_runner(pid: int, done: set[str]) -> Inspection:
    """Inspect the candidate-built libraries ``pid`` maps that are not in ``done`` (updated)."""
    result = Inspection()
    triton_cache = (
        os.environ.get("TRITON_CACHE_DIR", "").rstrip("/") + "/" if os.environ.get("TRITON_CACHE_DIR") else ""
    )
    for m in candidate_libraries(pid):
        if m.path in done:
            continue
        done.add(m.path)
        result.libraries.append(m.path)
        source = f"/proc/{pid}/map_files/{m.start}-{m.end}"
        try:
            names, raw = _symbols(source)
        except OSError:
            alternative = f"/proc/{pid}/root{m.path}"
            try:
                names, raw = _symbols(alternative)
            except OSError:
                result.unreadable.append(m.path)
                continue
        stub = _TRITON_CACHE in m.path or bool(triton_cache and m.path.startswith(triton_cache))
        bad = (
            offending_symbols(names, lookups_allowed=stub)
            or sorted({s.decode() for s in _STRINGS.findall(raw)})[:5]
        )
        if bad and result.offence is None:
            shown = ", ".join(bad[:5])
            result.offence = (
                f"native code the candidate built ({Path(m.path.split(' ')[0]).name}) computes with a "
                f"library ({shown}): compute must run in the candidate's own kernels"
            )
    return result
