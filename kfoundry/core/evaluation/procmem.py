"""Reading another process's memory and mappings (``/proc/<pid>/mem``, ``/proc/<pid>/maps``).

The judge reads a candidate's outputs straight out of the frozen runner process: the runner only says
where they are, it never copies them, so it cannot hand over one answer while its own code computes
another, and work still pending when it is frozen shows up as a wrong result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kfoundry.core.errors import KfError


class MemoryReadError(KfError):
    """The runner's memory could not be read at the address it named."""


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    path: str


def read_memory(pid: int, address: int, nbytes: int) -> bytearray:
    """``nbytes`` of process ``pid`` starting at ``address``."""
    if nbytes < 0 or address < 0:
        raise MemoryReadError(f"invalid memory range {address:#x}+{nbytes}")
    buf = bytearray(nbytes)
    if nbytes == 0:
        return buf
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as exc:
        raise MemoryReadError(f"cannot open the runner's memory: {exc.strerror}") from None
    try:
        view = memoryview(buf)
        done = 0
        while done < nbytes:
            try:
                n = os.preadv(fd, [view[done:]], address + done)
            except OSError as exc:
                raise MemoryReadError(
                    f"address {address + done:#x} is not readable in the runner: {exc.strerror}"
                ) from None
            if n <= 0:
                raise MemoryReadError(f"address {address + done:#x} is not readable in the runner")
            done += n
    finally:
        os.close(fd)
    return buf


def mappings(pid: int, marker: str = "") -> list[Mapping]:
    """The memory mappings of ``pid`` (only those whose line contains ``marker``, if given)."""
    out: list[Mapping] = []
    try:
        with open(f"/proc/{pid}/maps") as handle:
            text = handle.read()
    except OSError as exc:
        raise MemoryReadError(f"cannot read the runner's mappings: {exc.strerror}") from None
    lines = [ln for ln in text.splitlines() if marker in ln] if marker else text.splitlines()
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        lo, _, hi = parts[0].partition("-")
        out.append(Mapping(int(lo, 16), int(hi, 16), parts[1], parts[5] if len(parts) > 5 else ""))
    return out


def overlaps(maps: list[Mapping], marker: str, start: int, end: int) -> bool:
    """Whether [start, end) intersects a mapping whose path contains ``marker``."""
    return any(m.start < end and start < m.end for m in maps if marker in m.path)
