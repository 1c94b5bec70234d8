"""CUDA memory shared between the judge and the runner without the runner's help (CUDA IPC).

On a GPU the judge owns the input buffers: it allocates each one by itself (``cuMemAlloc``, so a
handle exposes that buffer and nothing else of the judge's), writes fresh inputs into them while the
runner is frozen, and hands the runner IPC handles once. The runner hands back, with every call's
answer, an IPC handle of the allocation each output lives in; the judge opens it and copies the output
out itself, again while the runner is frozen. So the runner is never thawed between a timed call and
the check of its outputs, and never sees an input before the clock that times it is running.

:class:`IdleProbe` tells the judge when the GPU has finished what the runner left on it: a tiny
kernel in the judge's own context cannot run while another context still has work queued (the GPU
time-slices contexts), so two fast probes in a row mean the runner's work is done.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any

import torch

from kfoundry.core.evaluation.arena import DTYPES, dtype_name


class ShareError(RuntimeError):
    """A CUDA IPC step failed (the caller falls back or rejects, with this message)."""


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def _check(result: Any, what: str) -> Any:
    code, *values = result if isinstance(result, tuple) else (result,)
    if int(code) != 0:
        drv = _driver()
        _, name = drv.cuGetErrorName(code)
        raise ShareError(f"{what}: {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def available() -> bool:
    """Whether this process can use CUDA IPC at all (cuda-python present, a CUDA device in torch)."""
    try:
        _driver()
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class _CudaArray:
    """``__cuda_array_interface__`` over a raw device pointer (torch wraps it without a copy)."""

    _TYPESTR = {
        torch.float16: "<f2",
        torch.bfloat16: "<V2",
        torch.float32: "<f4",
        torch.float64: "<f8",
        torch.int8: "|i1",
        torch.uint8: "|u1",
        torch.int16: "<i2",
        torch.int32: "<i4",
        torch.int64: "<i8",
        torch.bool: "|b1",
        torch.complex64: "<c8",
        torch.complex128: "<c16",
    }

    def __init__(self, ptr: int, dtype: torch.dtype, shape: list[int], stride: list[int] | None) -> None:
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.__cuda_array_interface__ = {
            "data": (ptr, False),
            "shape": tuple(shape),
            "typestr": self._TYPESTR[dtype],
            "strides": None if stride is None else tuple(s * itemsize for s in stride),
            "version": 3,
        }


def wrap(
    ptr: int, dtype: torch.dtype, shape: list[int], stride: list[int] | None, device: str
) -> torch.Tensor:
    """A torch tensor over device memory at ``ptr`` (no copy)."""
    if dtype == torch.bfloat16:  # no CAI type string for bfloat16: wrap as int16 and reinterpret
        return torch.as_tensor(_CudaArray(ptr, torch.int16, shape, stride), device=device).view(
            torch.bfloat16
        )
    return torch.as_tensor(_CudaArray(ptr, dtype, shape, stride), device=device)


def _encode(handle: Any) -> str:
    return base64.b64encode(bytes(handle.reserved)).decode()


def _decode(text: str) -> Any:
    raw = base64.b64decode(text, validate=True)
    drv = _driver()
    handle = drv.CUipcMemHandle()
    if len(raw) != len(bytes(handle.reserved)):
        raise ShareError("malformed IPC handle")
    handle.reserved = raw
    return handle


# -- the judge's side ------------------------------------------------------------------------------


@dataclass
class OwnedBuffer:
    """One input tensor's device memory, allocated by the judge alone."""

    ptr: int
    nbytes: int
    handle: str
    shift: int
    tensor: torch.Tensor

    def descriptor(self) -> list[Any]:
        return [self.handle, self.shift, dtype_name(self.tensor.dtype), list(self.tensor.shape)]


class JudgeBuffers:
    """Input buffers the judge owns and shares; freed when the job ends (after the runner is dead)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.buffers: list[OwnedBuffer] = []

    def allocate(self, like: torch.Tensor, aligned: bool = True) -> OwnedBuffer:
        """A buffer shaped like ``like``; unaligned ones start one element past the allocation's start."""
        drv = _driver()
        torch.cuda.current_device()  # the judge's context is current on this thread
        shift = 0 if aligned else like.element_size()
        nbytes = max(1, like.numel() * like.element_size() + shift)
        ptr = int(_check(drv.cuMemAlloc(nbytes), "cuMemAlloc"))
        try:
            handle = _check(drv.cuIpcGetMemHandle(ptr), "cuIpcGetMemHandle")
        except ShareError:
            drv.cuMemFree(ptr)
            raise
        tensor = wrap(ptr + shift, like.dtype, list(like.shape), None, self.device)
        buffer = OwnedBuffer(ptr, nbytes, _encode(handle), shift, tensor)
        self.buffers.append(buffer)
        return buffer

    def close(self) -> None:
        drv = _driver()
        for b in self.buffers:
            drv.cuMemFree(b.ptr)
        self.buffers = []


def read_shared(
    share: Any, dtype: torch.dtype, shape: list[int], stride: list[int], device: str
) -> torch.Tensor:
    """Copy a runner's output out of its memory through the IPC handle it named (runner frozen).

    ``share`` is ``[handle, offset, allocation size]`` from :func:`export`; the span the strides reach
    must lie inside the allocation.
    """
    if not (
        isinstance(share, list)
        and len(share) == 3
        and isinstance(share[0], str)
        and all(isinstance(x, int) and x >= 0 for x in share[1:])
    ):
        raise ShareError("malformed output share")
    handle_text, offset, size = share
    itemsize = torch.empty((), dtype=dtype).element_size()
    span = (sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1) * itemsize if all(shape) else 0
    if offset + span > size:
        raise ShareError(f"output reaches {offset + span} bytes into an allocation of {size}")
    drv = _driver()
    flags = drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    base = int(_check(drv.cuIpcOpenMemHandle(_decode(handle_text), flags), "cuIpcOpenMemHandle"))
    try:
        view = wrap(base + offset, dtype, shape, stride, device)
        copy = view.clone(memory_format=torch.contiguous_format)
        torch.cuda.synchronize()
    finally:
        drv.cuIpcCloseMemHandle(base)
    return copy


# -- the runner's side -----------------------------------------------------------------------------


class RunnerShares:
    """Imports the judge's input handles; exports output allocations (cached per allocation)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._exported: dict[tuple[int, int], str] = {}
        self.imported: list[tuple[int, int]] = []  # (base, nbytes) of the judge's buffers
        # the device's primary context made current on this thread: a backend that has not touched the
        # GPU yet (Triton compiles at the first launch) would have none, and cuIpcOpenMemHandle fails
        torch.empty(1, device=device)

    def import_input(self, descriptor: Any) -> torch.Tensor:
        handle_text, shift, dtype, shape = descriptor
        drv = _driver()
        torch.cuda.current_device()
        flags = drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        ptr = int(_check(drv.cuIpcOpenMemHandle(_decode(handle_text), flags), "cuIpcOpenMemHandle"))
        tensor = wrap(ptr + int(shift), DTYPES[dtype], list(shape), None, self.device)
        self.imported.append((ptr, tensor.numel() * tensor.element_size() + int(shift)))
        return tensor

    def export(self, tensor: torch.Tensor) -> list[Any] | None:
        """``[handle, offset, allocation size]`` of the allocation holding ``tensor`` (None: cannot)."""
        ptr = int(tensor.data_ptr())
        drv = _driver()
        try:
            base, size = _check(drv.cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
            base, size = int(base), int(size)
            key = (base, size)
            handle = self._exported.get(key)
            if handle is None:
                handle = _encode(_check(drv.cuIpcGetMemHandle(base), "cuIpcGetMemHandle"))
                self._exported[key] = handle
        except ShareError:
            return None
        return [handle, ptr - base, size]


class IdleProbe:
    """Waits, in the judge's own context, until the GPU has drained the runner's work."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.buffer = torch.zeros(1, device=device)
        self.idle_s = 0.0

    def once(self) -> float:
        t0 = time.perf_counter()
        self.buffer.add_(1)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def calibrate(self, rounds: int = 15) -> float:
        """Idle latency of one probe (median), measured while nothing else runs."""
        for _ in range(3):
            self.once()
        samples = sorted(self.once() for _ in range(rounds))
        self.idle_s = samples[len(samples) // 2]
        return self.idle_s

    def wait_idle(self, limit_s: float = 10.0) -> int:
        """Probe until two in a row come back at idle speed; returns how many probes it took."""
        fast_below = max(4 * self.idle_s, self.idle_s + 100e-6)
        streak, rounds = 0, 0
        stop = time.perf_counter() + limit_s
        while streak < 2 and time.perf_counter() < stop:
            rounds += 1
            streak = streak + 1 if self.once() <= fast_below else 0
        return rounds
