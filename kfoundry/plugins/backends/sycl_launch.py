"""SYCL launches: the launch geometry checked against the kernel, arguments marshalled for the shim.

Global size ``grid * block`` element-wise, local size ``block``; dimension ``i`` of the launch is
SYCL dimension ``i`` (the last one varies fastest); dimensions past the kernel's
``nd_range_kernel<N>`` must be 1. Tensor arguments are CPU torch tensors, passed as raw pointers with
no copy where the device supports USM system allocations; elsewhere they are copied into USM shared
memory and back around the launch. Scalars take the type the kernel declares, else the contract's:
Python ints as int32, floats as float32; numpy scalars keep their type. ``LocalMemory(nbytes)`` fills
a ``sycl::local_accessor<T, 1>`` parameter.
"""

from __future__ import annotations

import ctypes
import struct
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kfoundry.plugins.backends.launch import Dims, LaunchError, launch_dims
from kfoundry.plugins.backends.sycl_shim import message
from kfoundry.plugins.backends.sycl_source import KernelSignature, Param
from kfoundry.runtime import LocalMemory

#: Argument kinds, numbered as in sycl_shim.cpp.
KIND_CODE = {
    "ptr": 0, "i8": 1, "u8": 2, "i16": 3, "u16": 4, "i32": 5, "u32": 6, "i64": 7, "u64": 8,
    "f16": 9, "f32": 10, "f64": 11, "local": 12,
}  # fmt: skip
INT_BITS = {"i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64}
NUMPY_KIND = {
    "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32", "uint32": "u32",
    "int64": "i64", "uint64": "u64", "float16": "f16", "float32": "f32", "float64": "f64", "bool": "u8",
}  # fmt: skip


class Program:
    """A built program's native handles, released when its module is collected."""

    def __init__(self, lib: Any, bundle: int) -> None:
        self.kernels: dict[str, int] = {}
        self._finalizer = weakref.finalize(self, _release, lib, bundle, self.kernels)
        self._finalizer.atexit = False  # the runtime tears itself down at exit


def _release(lib: Any, bundle: int, kernels: dict[str, int]) -> None:
    for handle in kernels.values():
        lib.kf_release_kernel(handle)
    lib.kf_release_bundle(bundle)


@dataclass(frozen=True)
class Geometry:
    """A checked launch: the kernel's dimension count, the global size and the local size (None: any)."""

    ndim: int
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int] | None


def geometry(
    sig: KernelSignature, grid: Dims, block: Dims | None, max_wg: int | None, nargs: int
) -> Geometry:
    """Check ``grid``, ``block`` and the argument count against the kernel (raises :class:`LaunchError`)."""
    g = launch_dims(grid, "grid")
    b = launch_dims(block, "block")
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
    if nargs != len(sig.params):
        names = ", ".join(p.name or p.type for p in sig.params)
        raise LaunchError(f"kernel {sig.name} takes {len(sig.params)} arguments ({names}), got {nargs}")
    glob = tuple(gi * bi for gi, bi in zip(g3, b3, strict=True))
    return Geometry(ndim, glob, b3 if b is not None else None)  # type: ignore[arg-type]


@dataclass
class Marshalled:
    """A launch's arguments as the shim takes them, and the USM copies made for them."""

    kinds: list[int] = field(default_factory=list)
    values: list[int] = field(default_factory=list)
    #: The tensors passed (kept alive until the launch is waited for).
    tensors: list[Any] = field(default_factory=list)
    #: (tensor, USM pointer, bytes) of every argument copied into USM shared memory.
    copies: list[tuple[Any, int, int]] = field(default_factory=list)


def marshal(
    lib: Any, ctx: int, sig: KernelSignature, args: Sequence[Any], zero_copy: bool, out: Marshalled
) -> None:
    """Fill ``out`` with ``args`` for the kernel ``sig`` (``out.copies`` even when this raises: free them)."""
    import torch

    for i, (a, p) in enumerate(zip(args, sig.params, strict=True)):
        where = f"kernel {sig.name} argument {i} ({p.name or p.type})"
        kind, value = _arg(lib, ctx, a, p, where, zero_copy, torch, out.copies)
        out.kinds.append(KIND_CODE[kind])
        out.values.append(value)
        if isinstance(a, torch.Tensor):
            out.tensors.append(a)


def _arg(
    lib: Any,
    ctx: int,
    a: Any,
    p: Param,
    where: str,
    zero_copy: bool,
    torch: Any,
    copies: list[tuple[Any, int, int]],
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
        ptr = lib.kf_malloc_shared(ctx, nbytes)
        if not ptr:
            raise LaunchError(f"{where}: USM shared allocation of {nbytes} bytes failed: {message(lib)}")
        copies.append((a, ptr, nbytes))
        ctypes.memmove(ptr, a.data_ptr(), nbytes)
        return "ptr", int(ptr)
    if p.kind == "ptr":
        if a is None:
            return "ptr", 0
        raise LaunchError(f"{where}: the pointer parameter {p.type!r} needs a tensor, got {type(a).__name__}")
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
        kind = NUMPY_KIND.get(a.dtype.name)
        if kind is None:
            raise LaunchError(f"{where}: unsupported numpy type {a.dtype.name}")
        if p.kind is not None and p.kind != kind:
            raise LaunchError(f"{where}: numpy {a.dtype.name} for a parameter of type {p.type!r} ({p.kind})")
        return kind, bits(kind, a.item(), where)
    if isinstance(a, (bool, int)):
        kind = p.kind or "i32"
        return kind, bits(kind, a, where)
    if isinstance(a, float):
        kind = p.kind or "f32"
        if kind in INT_BITS:
            raise LaunchError(f"{where}: float {a!r} for the integer parameter {p.type!r}")
        return kind, bits(kind, a, where)
    raise LaunchError(f"{where}: unsupported argument type {type(a).__name__}")


def bits(kind: str, value: Any, where: str) -> int:
    """The 64-bit pattern the shim passes for scalar ``value`` of ``kind``."""
    if kind in INT_BITS:
        width = INT_BITS[kind]
        v = int(value)
        lo, hi = (0, 2**width - 1) if kind.startswith("u") else (-(2 ** (width - 1)), 2 ** (width - 1) - 1)
        if not lo <= v <= hi:
            raise LaunchError(f"{where}: {v} does not fit the parameter's {kind}")
        return v & (2**width - 1)
    fmt = {"f16": ("<e", "<H"), "f32": ("<f", "<I"), "f64": ("<d", "<Q")}[kind]
    try:
        packed = struct.pack(fmt[0], float(value))
    except OverflowError:
        raise LaunchError(f"{where}: {value} does not fit the parameter's {kind}") from None
    return int(struct.unpack(fmt[1], packed)[0])
