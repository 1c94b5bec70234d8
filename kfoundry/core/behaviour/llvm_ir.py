"""OpenCL measured features from the compiler: clang's optimised LLVM IR of the OpenCL C source.

Where an LLVM clang is on the machine (``clang-15`` comes with hipcc), the kernel source is compiled
to SPIR-flavoured LLVM IR at -O2 with the candidate's defines; the instruction mix (float, double,
half and integer arithmetic, built-in calls to special functions, sub-group collectives, barriers,
global and local memory accesses with their widths) and the local memory the kernels declare are
read from it. The backend's own report (pyopencl work-group info) is added to the record by the loop.
"""

from __future__ import annotations

import functools
import glob
import re
import shutil
import subprocess

from kfoundry.core.behaviour.mix import Instr, Listing, Mix, weigh
from kfoundry.core.models import ParamValue

_DEFINE = re.compile(r"^define\b.*\bspir_kernel\b.*@(\w+)\(")
_BLOCK = re.compile(r"^(\d+|[A-Za-z_.][\w.]*):")
_LABELS = re.compile(r"label %([\w.]+)")
_LOCAL_ARRAY = re.compile(r"^@[\w.]+ = .*addrspace\(3\) global (\[.*\]|\S+) ")
_SFU_CALL = re.compile(
    r"@_Z\d+(native_|half_)?(exp|exp2|exp10|log|log2|log10|sqrt|rsqrt|sin|cos|tan|tanh|erf|erfc|pow|powr|recip|divide)\w*"
)
_SUBGROUP = re.compile(
    r"@_Z\d+(sub_group_|intel_sub_group_|work_group_reduce|work_group_broadcast|work_group_scan)"
)
_VEC = re.compile(r"<(\d+) x (float|double|half|i\d+)>")
_SCALAR = {"float": 4, "double": 8, "half": 2, "i8": 1, "i16": 2, "i32": 4, "i64": 8}
_FLOAT_OPS = {"fadd": 1, "fsub": 1, "fmul": 1, "fdiv": 1, "fneg": 0, "fcmp": 0}


def _lanes_and_type(text: str) -> tuple[int, str]:
    vec = _VEC.search(text)
    if vec:
        return int(vec.group(1)), vec.group(2)
    for name in ("double", "half", "float"):
        if re.search(rf"\b{name}\b", text):
            return 1, name
    return 1, "int"


def _fp_class(kind: str) -> str:
    return {"float": "fp32", "double": "fp64", "half": "fp16"}.get(kind, "int")


def _instr(line: str) -> Instr | None:
    body = line.split("=", 1)[1].strip() if re.match(r"\s*%[\w.]+ = ", line) else line.strip()
    op = body.split(" ", 1)[0]
    if op in ("load", "store"):
        space = "global" if "addrspace(1)" in body else "local" if "addrspace(3)" in body else "private"
        if space == "private":
            return Instr("local" if "alloca" in body else "other")
        if space == "local":
            return Instr("shared")
        lanes, kind = _lanes_and_type(body.split(",")[0])
        width = lanes * _SCALAR.get(kind, 4)
        cls = "global_load" if op == "load" else "global_store"
        return Instr(cls, global_bytes=width, wide=lanes > 1)
    if op in _FLOAT_OPS:
        lanes, kind = _lanes_and_type(body)
        return Instr(_fp_class(kind), _FLOAT_OPS[op] * lanes)
    if op in (
        "add",
        "sub",
        "mul",
        "shl",
        "lshr",
        "ashr",
        "and",
        "or",
        "xor",
        "icmp",
        "sdiv",
        "udiv",
        "srem",
        "urem",
    ):
        return Instr("int")
    if "call" in op or body.startswith(("tail call", "call")):
        if "@_Z7barrierj" in body or "work_group_barrier" in body:
            return Instr("barrier")
        if _SUBGROUP.search(body):
            return Instr("shuffle")
        if re.search(r"@_Z\d+atom|@_Z\d+atomic_", body) or "atomicrmw" in body:
            return Instr("atomic", global_bytes=4)
        if "async_work_group_copy" in body or "prefetch" in body:
            return Instr("async_copy")
        lanes, kind = _lanes_and_type(body.split("(", 1)[0])
        if _SFU_CALL.search(body):
            return Instr("sfu", lanes)
        if re.search(r"@(_Z\d+fma|_Z\d+mad|llvm\.fmuladd|llvm\.fma)", body):
            return Instr(_fp_class(kind), 2 * lanes)
        if re.search(r"@(_Z\d+f(min|max)|llvm\.(min|max)num)", body):
            return Instr(_fp_class(kind), lanes)
        if re.search(r"@_Z\d+vload(\d+)", body):
            n = int(re.search(r"@_Z\d+vload(\d+)", body).group(1))  # type: ignore[union-attr]
            return (
                Instr("global_load", global_bytes=4 * n, wide=True)
                if "AS1" in body or "AS4" in body
                else Instr("shared")
            )
        if re.search(r"@_Z\d+vstore(\d+)", body):
            n = int(re.search(r"@_Z\d+vstore(\d+)", body).group(1))  # type: ignore[union-attr]
            return Instr("global_store", global_bytes=4 * n, wide=True)
        return Instr("other")
    if op == "atomicrmw":
        return Instr("atomic", global_bytes=4)
    return None


def parse_ir(text: str) -> tuple[list[Listing], int]:
    """One :class:`Listing` per ``spir_kernel`` and the bytes of local memory the module declares."""
    listings: list[Listing] = []
    local_bytes = 0
    current: Listing | None = None
    for line in text.splitlines():
        array = _LOCAL_ARRAY.match(line)
        if array:
            local_bytes += _type_bytes(array.group(1))
        if _DEFINE.match(line):
            current = Listing()
            current.label("entry")
            listings.append(current)
            continue
        if current is None:
            continue
        if line.startswith("}"):
            current = None
            continue
        block = _BLOCK.match(line)
        if block:
            current.label(block.group(1))
            continue
        stripped = line.strip()
        if stripped.startswith("br "):
            for target in _LABELS.findall(stripped):
                current.branch(target)
            current.add(Instr("other"), stop=True)
            continue
        if stripped.startswith(("ret", "unreachable", "switch")):
            if stripped.startswith("switch"):
                for target in _LABELS.findall(stripped):
                    current.branch(target)
            current.add(Instr("other"), stop=True)
            continue
        instr = _instr(line)
        if instr is not None:
            current.add(instr)
    return listings, local_bytes


def _type_bytes(text: str) -> int:
    dims = [int(d) for d in re.findall(r"\[(\d+) x", text)]
    inner = re.findall(r"x (float|double|half|i\d+)\]", text) or [text.strip()]
    size = _SCALAR.get(inner[-1], 4)
    for d in dims:
        size *= d
    return size


@functools.lru_cache(maxsize=1)
def find_clang() -> str | None:
    """An LLVM clang able to compile OpenCL C (the newest Debian LLVM's, else the PATH's)."""
    found = sorted(glob.glob("/usr/lib/llvm-*/bin/clang"), key=lambda p: int(re.sub(r"\D", "", p) or 0))
    return found[-1] if found else shutil.which("clang")


class IRCompileFailed(Exception):
    """clang refused the OpenCL C; the message is its diagnostics."""


def compile_ir(source: str, defines: dict[str, ParamValue], timeout_s: float = 60.0) -> str | None:
    """clang's -O2 LLVM IR of OpenCL C ``source`` (None without clang; :class:`IRCompileFailed` with the log)."""
    clang = find_clang()
    if clang is None:
        return None
    flags = [f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in defines.items()]
    cmd = [
        clang,
        "-x",
        "cl",
        "-cl-std=CL2.0",
        "-Xclang",
        "-finclude-default-header",
        "-target",
        "spir64",
        "-O2",
        "-S",
        "-emit-llvm",
        "-w",
        "-o",
        "-",
        *flags,
        "-",
    ]
    try:
        proc = subprocess.run(cmd, input=source, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        raise IRCompileFailed(str(exc)) from None
    if proc.returncode != 0:
        raise IRCompileFailed(proc.stderr[-4000:])
    return proc.stdout


def instruction_mix(source: str, defines: dict[str, ParamValue]) -> tuple[Mix, int] | None:
    """The loop-weighted mix and declared local bytes of OpenCL C ``source`` (None without clang).

    Raises :class:`IRCompileFailed` when clang refuses the source."""
    ir = compile_ir(source, defines)
    if ir is None:
        return None
    listings, local_bytes = parse_ir(ir)
    return weigh(listings), local_bytes
