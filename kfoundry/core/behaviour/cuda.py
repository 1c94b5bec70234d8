"""CUDA measured features: SASS (nvdisasm) or PTX instruction mix, ptxas resources, occupancy.

The kernels of a candidate are compiled with the CUDA backend's own compiler (NVRTC, else nvcc) for
the device's architecture (sm_90, the H200's, without a device). With ``nvdisasm`` (the
``nvidia-cuda-nvdisasm`` wheel or a toolkit's) the machine code itself is read; otherwise the PTX
NVRTC emitted. Theoretical occupancy is CUDA's occupancy calculation from registers, shared memory
and the block size (see :func:`kfoundry.core.behaviour.measure.block_size`).
"""

from __future__ import annotations

import functools
import glob
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kfoundry.core.behaviour.mix import Instr, Listing, Mix, weigh

# -- SASS ------------------------------------------------------------------------------------------

_SASS_LINE = re.compile(
    r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);"
)
_SASS_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_SASS_TARGET = re.compile(r"`\((\.L_x_\d+)\)")

_SASS_FP32 = {
    "FADD": 1,
    "FMUL": 1,
    "FFMA": 2,
    "FMNMX": 1,
    "FSETP": 0,
    "FSET": 0,
    "FSEL": 0,
    "FCHK": 0,
    "FRND": 0,
}
_SASS_FP64 = {"DADD": 1, "DMUL": 1, "DFMA": 2, "DMNMX": 1, "DSETP": 0}
_SASS_FP16 = {"HADD2": 2, "HMUL2": 2, "HFMA2": 4, "HMNMX2": 2, "HSETP2": 0}
_SASS_TENSOR = {"HMMA", "IMMA", "DMMA", "BMMA", "HGMMA", "IGMMA", "QGMMA", "BGMMA"}
_SASS_INT = {
    "IMAD",
    "IADD3",
    "IADD",
    "LEA",
    "LOP3",
    "LOP",
    "SHF",
    "SHL",
    "SHR",
    "ISETP",
    "IMNMX",
    "IABS",
    "POPC",
    "FLO",
    "BREV",
    "PRMT",
    "IDP",
    "I2F",
    "F2I",
    "I2I",
    "F2F",
    "VIADD",
    "VIMNMX",
}
_SASS_SHUFFLE = {"SHFL", "VOTE", "VOTEU", "REDUX", "MATCH"}
_SASS_ASYNC = {"LDGSTS", "LDGDEPBAR", "UTMALDG", "UTMASTG", "UBLKCP", "SYNCS", "UTMAPF"}


def _width(suffix: str) -> int:
    """Bytes per lane of a SASS memory access from its suffixes (.64, .128, .U8 ...)."""
    for token, size in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1), (".S8", 1)):
        if token in suffix:
            return size
    return 4


def parse_sass(text: str) -> list[Listing]:
    """One :class:`Listing` per kernel in ``nvdisasm`` output."""
    listings: list[Listing] = []
    current: Listing | None = None
    for line in text.splitlines():
        if line.startswith("//----") and ".text." in line:
            current = Listing()
            listings.append(current)
            continue
        if current is None:
            continue
        label = _SASS_LABEL.match(line)
        if label:
            current.label(label.group(1))
            continue
        found = _SASS_LINE.search(line)
        if not found:
            continue
        predicate, op, suffix, operands = found.groups()
        if op == "NOP":
            continue
        if op in ("BRA", "BRX", "JMP"):
            target = _SASS_TARGET.search(operands)
            if target:
                current.branch(target.group(1))
            current.add(Instr("other"), stop=predicate is None)
            continue
        if op in ("EXIT", "RET"):
            current.add(Instr("other"), stop=predicate is None)
            continue
        current.add(_sass_instr(op, suffix, operands))
    return listings


def _sass_instr(op: str, suffix: str, operands: str) -> Instr:
    if op in _SASS_FP32:
        return Instr("fp32", _SASS_FP32[op])
    if op in _SASS_FP64:
        return Instr("fp64", _SASS_FP64[op])
    if op in _SASS_FP16:
        if op == "HFMA2" and ".MMA" in suffix and "-RZ, RZ" in operands:
            return Instr("other")  # ptxas's idiom for a constant move
        return Instr("fp16", _SASS_FP16[op])
    if op == "MUFU":
        return Instr("sfu", 1)
    if op in _SASS_TENSOR:
        return Instr("tensor", 64)
    if op in ("LDG", "LD"):
        width = _width(suffix)
        cls = "readonly_load" if ".CONSTANT" in suffix else "global_load"
        return Instr(cls, global_bytes=width, wide=width >= 16)
    if op in ("STG", "ST"):
        width = _width(suffix)
        return Instr("global_store", global_bytes=width, wide=width >= 16)
    if op in ("LDS", "STS", "LDSM", "ATOMS", "STSM"):
        return Instr("shared")
    if op in ("LDL", "STL"):
        return Instr("local")
    if op in _SASS_SHUFFLE:
        return Instr("shuffle")
    if op == "BAR":
        return Instr("barrier")
    if op in _SASS_ASYNC:
        return Instr("async_copy")
    if op in ("ATOMG", "ATOM", "RED", "REDG"):
        return Instr("atomic", global_bytes=_width(suffix))
    if op in _SASS_INT:
        return Instr("int")
    return Instr("other")


# -- PTX -------------------------------------------------------------------------------------------

_PTX_LINE = re.compile(r"^\s*(@!?%p\w*\s+)?([a-z][\w.:]*)\s*([^;]*);")
_PTX_LABEL = re.compile(r"^\s*(\$?[\w$]+):\s*$")
_PTX_ENTRY = re.compile(r"^\s*\.(?:visible\s+)?\.?entry\s+(\w+)|^\.visible \.entry (\w+)")
_PTX_SFU = {"ex2", "lg2", "sin", "cos", "rcp", "sqrt", "rsqrt", "tanh"}
_PTX_ARITH = {
    "add": 1,
    "sub": 1,
    "mul": 1,
    "fma": 2,
    "mad": 2,
    "min": 1,
    "max": 1,
    "neg": 0,
    "abs": 0,
    "div": 1,
    "setp": 0,
    "selp": 0,
    "set": 0,
    "cvt": 0,
}
_BITS = re.compile(r"\.[fbsu](8|16|32|64)\b")


def parse_ptx(text: str) -> list[Listing]:
    """One :class:`Listing` per ``.entry`` in a PTX module."""
    listings: list[Listing] = []
    current: Listing | None = None
    for line in text.splitlines():
        if ".entry" in line and _PTX_ENTRY.search(line):
            current = Listing()
            listings.append(current)
            continue
        if current is None or line.lstrip().startswith(("//", ".")):
            continue
        label = _PTX_LABEL.match(line)
        if label:
            current.label(label.group(1))
            continue
        found = _PTX_LINE.match(line)
        if not found:
            continue
        predicate, op, operands = found.groups()
        parts = op.split(".")
        if parts[0] == "bra":
            current.branch(operands.strip())
            current.add(Instr("other"), stop=predicate is None)
            continue
        if parts[0] in ("ret", "exit"):
            current.add(Instr("other"), stop=predicate is None)
            continue
        current.add(_ptx_instr(parts, op))
    return listings


def _ptx_instr(parts: list[str], op: str) -> Instr:
    base = parts[0]
    if base in ("ld", "st", "ldu"):
        bits = _BITS.search(op)
        lanes = 4 if ".v4" in op else 2 if ".v2" in op else 1
        width = lanes * (int(bits.group(1)) // 8 if bits else 4)
        if ".shared" in op:
            return Instr("shared")
        if ".local" in op:
            return Instr("local")
        if ".param" in op or ".const" in op:
            return Instr("other")
        if base == "st":
            return Instr("global_store", global_bytes=width, wide=lanes > 1)
        cls = "readonly_load" if ".nc" in op or base == "ldu" else "global_load"
        return Instr(cls, global_bytes=width, wide=lanes > 1)
    if base in ("mma", "wmma", "wgmma"):
        return Instr("tensor", 64)
    if base in ("shfl", "vote", "redux", "match", "activemask"):
        return Instr("shuffle")
    if base in ("bar", "barrier"):
        return Instr("barrier")
    if base == "cp" and "async" in op:
        return Instr("async_copy")
    if base in ("atom", "red"):
        return Instr("atomic", global_bytes=4)
    if base in _PTX_SFU:
        return Instr("sfu", 1)
    if base in _PTX_ARITH:
        flops = float(_PTX_ARITH[base])
        if ".f64" in op:
            return Instr("fp64", flops)
        if ".f16" in op or ".bf16" in op:
            return Instr("fp16", flops * (2 if "x2" in op else 1))
        if ".f32" in op and base != "cvt":
            return Instr("fp32", flops)
        return Instr("int")
    if base in ("and", "or", "xor", "not", "shl", "shr", "popc", "clz", "brev", "bfe", "bfi", "prmt", "lop3"):
        return Instr("int")
    return Instr("other")


# -- occupancy -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmLimits:
    """Per-SM limits used by CUDA's occupancy calculation (defaults: sm_90, the H100/H200)."""

    max_warps: int = 64
    max_blocks: int = 32
    registers: int = 65536
    register_unit: int = 256
    max_registers_per_thread: int = 255
    shared_bytes: int = 233472
    shared_unit: int = 128
    shared_reserved_per_block: int = 1024
    warp_size: int = 32


#: Limits per compute capability (major, minor); unknown ones use sm_90's.
SM_LIMITS: dict[tuple[int, int], SmLimits] = {
    (9, 0): SmLimits(),
    (8, 0): SmLimits(shared_bytes=167936),
    (8, 6): SmLimits(max_warps=48, max_blocks=16, shared_bytes=102400),
    (8, 9): SmLimits(max_warps=48, max_blocks=24, shared_bytes=102400),
    (7, 0): SmLimits(shared_bytes=98304, shared_reserved_per_block=0),
}


def occupancy(registers: int, shared_bytes: int, threads: int, limits: SmLimits) -> float:
    """Active warps per SM over the maximum (0-1) for one kernel's resources and block size."""
    threads = max(1, min(threads, 1024))
    warps = math.ceil(threads / limits.warp_size)
    per_warp = math.ceil(max(registers, 1) * limits.warp_size / limits.register_unit) * limits.register_unit
    by_regs = (limits.registers // per_warp) // warps if registers <= limits.max_registers_per_thread else 0
    blocks = min(limits.max_blocks, limits.max_warps // warps, by_regs)
    if shared_bytes > 0:
        need = (
            math.ceil((shared_bytes + limits.shared_reserved_per_block) / limits.shared_unit)
            * limits.shared_unit
        )
        blocks = min(blocks, limits.shared_bytes // need)
    return max(0, blocks) * warps / limits.max_warps


def limits_for(compute_capability: str | None) -> SmLimits:
    try:
        major, minor = (int(p) for p in (compute_capability or "9.0").split(".")[:2])
    except ValueError:
        return SmLimits()
    return SM_LIMITS.get((major, minor), SmLimits())


#: ``.maxntid``/``.reqntid`` in PTX: the block size a kernel's ``__launch_bounds__`` promises.
MAXNTID = re.compile(r"\.(?:maxntid|reqntid)\s+(\d+)(?:,\s*(\d+))?(?:,\s*(\d+))?")


# -- disassembler ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def find_nvdisasm() -> str | None:
    """nvdisasm: the environment's ``nvidia-cuda-nvdisasm`` wheel, a CUDA toolkit's, or the PATH's."""
    here = Path(sys.prefix) / "lib"
    found = sorted(
        glob.glob(str(here / "python3*" / "site-packages" / "nvidia" / "cu*" / "bin" / "nvdisasm"))
    )
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    found += [str(Path(r) / "bin" / "nvdisasm") for r in roots if r]
    for path in found:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("nvdisasm")


def disassemble(cubin: bytes, timeout_s: float = 60.0) -> str | None:
    """SASS text of ``cubin`` (None without nvdisasm or when it fails)."""
    tool = find_nvdisasm()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        try:
            proc = subprocess.run(
                [tool, "-c", handle.name], capture_output=True, text=True, timeout=timeout_s
            )
        except (OSError, subprocess.SubprocessError):
            return None
    return proc.stdout if proc.returncode == 0 else None


def instruction_mix(cubin: bytes, ptx: str) -> tuple[Mix, str]:
    """The loop-weighted mix from SASS when nvdisasm runs, else from PTX; with the listing's name."""
    sass = disassemble(cubin) if cubin else None
    if sass:
        listings = parse_sass(sass)
        if listings:
            return weigh(listings), "sass"
    return weigh(parse_ptx(ptx)), "ptx"
