"""An audit hook in the runner (PEP 578): the ways to a library's compute that no torch dispatch mode sees.

The forward guard (``guard.py``) sees torch operators, and ``extensions.py`` reads what a candidate's own
shared objects import. Neither sees Python reaching a computing library some other way: CuPy or JAX
imported under a computed name, ``ctypes`` calling cuBLAS (or a CPU BLAS, or ATen's C++ entry points)
in a library torch has already loaded, a function pointer found by ``dlsym`` with a name put together
at run time. An audit hook sees the final name and address whatever the spelling, and once added it
cannot be removed from Python. Armed in the runner just before candidate code runs, it refuses (raises
:class:`LibraryRefused` and records the offence, which makes the verdict ``rejected``):

- importing a package that computes on its own (:data:`COMPUTING_PACKAGES`) or a sub-interpreter module
  (a new interpreter starts without the hook);
- ``ctypes`` opening a computing library, looking up a computing symbol, or calling a function whose
  address lies in a computing library or in the interpreter itself (``ctypes.pythonapi``);
- the garbage collector's object walks (the way from Python to the hook's own list).

This is policy (compute in the candidate's own kernels), like the forward guard; the trust boundary is
the sandbox. Code that writes raw memory (``ctypes.memmove``, a ctypes array at a raw address: the OpenCL
backend itself makes those) can still find and clear the hook's list; docs/evaluation.md says so.
"""

from __future__ import annotations

import bisect
import os
import re
import sys
from typing import Any

#: Packages whose import a candidate's code may not trigger once the hook is armed (top-level names).
COMPUTING_PACKAGES = frozenset(
    {
        "cupy",
        "cupyx",
        "cupy_backends",
        "nvmath",
        "cutlass",
        "cutlass_library",
        "jax",
        "jaxlib",
        "tensorflow",
        "scipy",
        "sklearn",
        "numexpr",
        "_interpreters",
        "_xxsubinterpreters",
        "_interpchannels",
        "_xxinterpchannels",
        "_interpqueues",
    }
)
#: Full module names refused as well (torch.compile's code generators run a graph without the dispatcher).
COMPUTING_MODULES = frozenset({"torch._inductor", "concurrent.interpreters"})
#: A computing shared library by file name (cuBLAS, cuDNN, ..., CPU BLAS, libtorch and c10, libpython).
_LIBRARY_FILE = re.compile(
    r"lib(cublas|cublasLt|cudnn|cufft|cusparse|cusolver|cutensor|nvblas|curand|openblas|scipy_openblas|"
    r"mkl|blis|flexiblas|lapack|torch|c10|python|cupy)[^/]*\.so"
)
#: A computing symbol by name (C, Fortran BLAS, mangled ATen / c10 / torch C++, the Python C API).
_SYMBOL = re.compile(
    r"^(cublas|cudnn|cufft|cusparse|cusolver|cutensor|nvblas|curand|cblas_|openblas|mkl_|LAPACKE_|"
    r"[sdcz](gemm|gemv|symm|syrk|trsm|trmm|axpy|dot|scal)_?$|_ZN2at|_ZN3c10|_ZN5torch|Py|_Py)"
)
_WATCHED = frozenset(
    {
        "import",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.dlsym/handle",
        "ctypes.call_function",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
    }
)


class LibraryRefused(PermissionError):
    """A candidate reached a computing library (or the hook's own state) past the forward guard."""


#: What the armed hook refused so far (a candidate that clears it gains nothing: the act was refused).
_OFFENCES: list[str] = []


def arm() -> None:
    """Install the hook (at most once per process): from now on this process refuses what the docstring lists.

    Everything the hook uses is bound here, in its closure, and the hook itself is referenced by nothing
    but the interpreter's hook list: replacing this module's globals, ``os.path`` or a builtin afterwards
    changes nothing, and the gc walks that would find the hook are refused.
    """
    if getattr(arm, "_installed", False):
        return
    executable = os.path.realpath(sys.executable)
    library_file, symbol, watched = _LIBRARY_FILE, _SYMBOL, _WATCHED
    packages, modules = COMPUTING_PACKAGES, COMPUTING_MODULES
    basename, bisect_right, fromhex = os.path.basename, bisect.bisect_right, int
    text, record, refused, is_int = str, _OFFENCES, LibraryRefused, isinstance
    length, any_of, opener, count = len, any, open, range
    state: dict[str, Any] = {"starts": [], "spans": []}

    def refresh_maps() -> None:
        spans: list[tuple[int, int, str]] = []
        try:
            with opener("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            lines = []
        for line in lines:
            parts = line.split(maxsplit=5)
            if length(parts) < 6:
                continue
            path = parts[5].strip()
            name = basename(path)
            if library_file.search(name) or path == executable:
                low, high = (fromhex(x, 16) for x in parts[0].split("-"))
                spans.append((low, high, name))
        spans.sort()
        state["spans"], state["starts"] = spans, [span[0] for span in spans]

    def library_at(address: int) -> str | None:
        for attempt in count(2):
            i = bisect_right(state["starts"], address) - 1
            if i >= 0 and state["spans"][i][0] <= address < state["spans"][i][1]:
                return text(state["spans"][i][2])
            if attempt == 0:
                refresh_maps()  # a library loaded since
        return None

    def offence_of(event: str, args: tuple[Any, ...]) -> str | None:
        if event == "import":
            name = text(args[0]) if args else ""
            top = name.split(".")[0]
            if top in packages or any_of(name == m or name.startswith(m + ".") for m in modules):
                return f"import of {name}"
            return None
        if event == "ctypes.dlopen":
            name = basename(text(args[0])) if args and args[0] is not None else ""
            return f"ctypes.CDLL({name})" if library_file.search(name + ".so") else None
        if event in ("ctypes.dlsym", "ctypes.dlsym/handle"):
            name = text(args[1]) if length(args) > 1 else ""
            return f"ctypes lookup of {name}" if symbol.search(name) else None
        if event == "ctypes.call_function":
            library = library_at(args[0]) if args and is_int(args[0], int) else None
            return f"ctypes call into {library}" if library else None
        return f"{event}()"  # the gc's object walks

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in watched:
            return
        offence = offence_of(event, args)
        if offence is None:
            return
        if length(record) < 20:
            record.append(offence)
        raise refused(f"refused: {offence} (compute must run in the candidate's own kernels)")

    refresh_maps()
    sys.addaudithook(hook)
    arm._installed = True  # type: ignore[attr-defined]


def offences() -> list[str]:
    """What the armed hook refused so far (at most 20)."""
    return list(_OFFENCES)
