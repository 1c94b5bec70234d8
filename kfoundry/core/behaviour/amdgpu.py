"""HIP measured features: the AMDGPU code object's ISA (llvm-objdump) and its resource metadata.

Registers, LDS and occupancy (waves per SIMD) come from the HIP backend's report (the code object's
metadata and LLVM's resource-usage remarks); the instruction mix from disassembling the code object
for its target (``llvm-objdump -d --mcpu=gfx90a``).
"""

from __future__ import annotations

import functools
import glob
import re
import shutil
import subprocess
import tempfile

from kfoundry.core.behaviour.mix import Instr, Listing, Mix, weigh

_FUNC = re.compile(r"^([0-9a-f]+) <([^>]+)>:")
_LINE = re.compile(r"^\s+([a-z][a-z0-9_]*)\s*([^/]*)//\s*([0-9A-F]+):[^<]*(?:<([^>+]+)\+0x([0-9a-f]+)>)?")
_SFU = ("v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_", "v_sin_", "v_cos_")
_DPP = re.compile(
    r"\b(quad_perm|row_shr|row_shl|row_ror|row_bcast|row_mirror|wave_shr|wave_ror|row_newbcast)"
)
_WIDTH = {
    "dwordx4": 16,
    "dwordx3": 12,
    "dwordx2": 8,
    "dword": 4,
    "short": 2,
    "ushort": 2,
    "sshort": 2,
    "ubyte": 1,
    "sbyte": 1,
    "byte": 1,
    "b128": 16,
    "b96": 12,
    "b64": 8,
    "b32": 4,
    "b16": 2,
    "b8": 1,
}


def _global_width(op: str) -> int:
    suffix = op.split("_", 2)[-1]
    return _WIDTH.get(suffix, 4)


def _instr(op: str, operands: str) -> Instr:
    if op.startswith("v_mfma") or op.startswith("v_smfmac"):
        return Instr("tensor", 64)
    if op.startswith(("global_load", "buffer_load", "flat_load")):
        width = _global_width(op)
        return Instr("global_load", global_bytes=width, wide=width >= 12)
    if op.startswith(("global_store", "buffer_store", "flat_store")):
        width = _global_width(op)
        return Instr("global_store", global_bytes=width, wide=width >= 12)
    if op.startswith(("global_atomic", "buffer_atomic", "flat_atomic")):
        return Instr("atomic", global_bytes=4)
    if op.startswith(("ds_bpermute", "ds_permute", "ds_swizzle")) or op.startswith(
        ("v_readlane", "v_writelane")
    ):
        return Instr("shuffle")
    if op.startswith("ds_"):
        return Instr("shared")
    if op.startswith(("scratch_", "buffer_load_dword off")):
        return Instr("local")
    if op == "s_barrier":
        return Instr("barrier")
    if op.startswith("v_") and _DPP.search(operands):
        return Instr("shuffle")
    if op.startswith(_SFU):
        return Instr("sfu", 1)
    if op.startswith("v_"):
        flops = 2.0 if ("fma" in op or "mac" in op or "mad_f" in op) else 1.0
        if op.endswith("_f64") or "_f64_" in op:
            return Instr("fp64", flops)
        if "_f16" in op or "_pk_" in op and "f16" in op or "bf16" in op:
            return Instr("fp16", flops * (2 if "_pk_" in op else 1))
        if op.endswith(("_f32", "_f32_e32", "_f32_e64")) or "_f32_" in op:
            if op.startswith(("v_cvt", "v_cmp", "v_cndmask")):
                return Instr("fp32", 0)
            return Instr("fp32", flops)
        return Instr("int")
    if op.startswith("s_") and not op.startswith(
        ("s_waitcnt", "s_nop", "s_endpgm", "s_load", "s_cbranch", "s_branch")
    ):
        return Instr("int")
    return Instr("other")


def parse_objdump(text: str) -> list[Listing]:
    """One :class:`Listing` per function of ``llvm-objdump -d`` output of an AMDGPU code object."""
    listings: list[Listing] = []
    current: Listing | None = None
    start = 0
    for line in text.splitlines():
        func = _FUNC.match(line)
        if func:
            current, start = Listing(), int(func.group(1), 16)
            listings.append(current)
            continue
        if current is None:
            continue
        found = _LINE.match(line)
        if not found:
            continue
        op, operands, address, _sym, offset = found.groups()
        if op in ("s_nop", "s_waitcnt", "s_code_end"):
            continue
        current.label(str(int(address, 16)))
        if op.startswith(("s_cbranch", "s_branch")):
            if offset is not None:
                current.branch(str(start + int(offset, 16)))
            current.add(Instr("other"), stop=op.startswith("s_branch"))
            continue
        current.add(_instr(op, operands), stop=op == "s_endpgm")
    return listings


@functools.lru_cache(maxsize=1)
def find_objdump() -> str | None:
    """An llvm-objdump that knows AMDGPU: the newest Debian LLVM's, else the PATH's."""
    found = sorted(
        glob.glob("/usr/lib/llvm-*/bin/llvm-objdump"), key=lambda p: int(re.sub(r"\D", "", p) or 0)
    )
    return found[-1] if found else shutil.which("llvm-objdump")


def instruction_mix(code_object: bytes, arch: str, timeout_s: float = 60.0) -> Mix | None:
    """The loop-weighted mix of every function in ``code_object`` (None without llvm-objdump)."""
    tool = find_objdump()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".co") as handle:
        handle.write(code_object)
        handle.flush()
        try:
            proc = subprocess.run(
                [tool, "-d", f"--mcpu={arch.split(':')[0]}", handle.name],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except (OSError, subprocess.SubprocessError):
            return None
    if proc.returncode != 0:
        return None
    return weigh(parse_objdump(proc.stdout))
