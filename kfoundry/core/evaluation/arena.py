"""Shared-memory input slots: the judge writes fresh inputs, the runner sees them without a copy.

One ``memfd`` (named :data:`ARENA_NAME`, so the judge can tell from the runner's mappings whether an
output aliases an input) holds every slot; a slot is one set of forward arguments. The judge writes
values only while the runner is frozen, so nothing in the runner can look at inputs before the clock
that times it has started.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import torch

ARENA_NAME = "kf-arena"
ALIGN = 64

DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Slot:
    """One set of forward arguments: tensors in the arena, other values as JSON."""

    descriptor: list[list[Any]]
    views: list[torch.Tensor | None] = field(default_factory=list)


class Arena:
    """The judge's side: a memfd it maps read-write and places slots in."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(ALIGN, _align(capacity))
        self.fd = os.memfd_create(ARENA_NAME, 0)
        os.ftruncate(self.fd, self.capacity)
        self._map = mmap.mmap(self.fd, self.capacity)
        self._cursor = 0
        self.slots: list[Slot] = []

    def place(self, values: list[Any], aligned: bool = True) -> int:
        """Reserve a slot shaped like ``values`` (and write them); returns the slot's index."""
        descriptor: list[list[Any]] = []
        views: list[torch.Tensor | None] = []
        for value in values:
            if isinstance(value, torch.Tensor):
                t = value.detach()
                size = t.numel() * t.element_size()
                offset = _align(self._cursor) + (0 if aligned else t.element_size())
                if offset + size > self.capacity:
                    raise MemoryError(f"input arena full ({self.capacity} bytes)")
                self._cursor = offset + size
                view = self._view(offset, t.dtype, list(t.shape))
                descriptor.append(["tensor", offset, dtype_name(t.dtype), list(t.shape)])
                views.append(view)
            else:
                descriptor.append(["value", value])
                views.append(None)
        self.slots.append(Slot(descriptor, views))
        self.write(len(self.slots) - 1, values)
        return len(self.slots) - 1

    def describe_only(self, values: list[Any]) -> int:
        """A slot whose tensors live elsewhere (the judge's device buffers): no arena bytes, no views."""
        descriptor = [
            ["tensor", 0, dtype_name(v.dtype), list(v.shape)] if isinstance(v, torch.Tensor) else ["value", v]
            for v in values
        ]
        self.slots.append(Slot(descriptor, [None] * len(values)))
        return len(self.slots) - 1

    def _view(self, offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        return view_of(self._map, offset, dtype, shape)

    def write(self, index: int, values: list[Any]) -> None:
        """Overwrite slot ``index`` with ``values`` (same shapes and dtypes)."""
        for view, value in zip(self.slots[index].views, values, strict=True):
            if view is not None:
                view.copy_(value.detach().reshape(view.shape).to("cpu"))

    def unchanged(self, index: int, values: list[Any]) -> int | None:
        """The first tensor argument of slot ``index`` that differs from ``values`` (None: all equal)."""
        for i, (view, value) in enumerate(zip(self.slots[index].views, values, strict=True)):
            if view is None:
                continue
            original = value.detach().reshape(view.shape).to("cpu")
            if not torch.equal(view, original) and not _equal_with_nan(view, original):
                return i
        return None

    def close(self) -> None:
        for slot in self.slots:
            slot.views.clear()
        self.slots.clear()
        self._map.close()
        os.close(self.fd)


def _equal_with_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.dtype.is_floating_point:
        return False
    return bool(torch.equal(torch.isnan(a), torch.isnan(b))) and bool(
        torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    )


def view_of(buffer: Any, offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A tensor over ``buffer`` bytes at ``offset`` (no copy)."""
    numel = 1
    for s in shape:
        numel *= int(s)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    size = numel * torch.empty((), dtype=dtype).element_size()
    flat = torch.frombuffer(buffer, dtype=torch.uint8, count=size, offset=offset)
    return flat.view(dtype).view(shape)


class RunnerArena:
    """The runner's side: maps the judge's memfd and builds argument lists from slot descriptors."""

    def __init__(self, fd: int, capacity: int) -> None:
        self._map = mmap.mmap(fd, capacity)
        os.close(fd)

    def arguments(self, descriptor: list[list[Any]]) -> list[Any]:
        args: list[Any] = []
        for item in descriptor:
            if item[0] == "tensor":
                _, offset, dtype, shape = item
                args.append(view_of(self._map, int(offset), DTYPES[dtype], list(shape)))
            else:
                args.append(item[1])
        return args
