"""The few libc calls and Linux constants confinement needs (unshare, mount, pivot_root, capset, prctl)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
from typing import Any

CLONE_NEWNS = 0x00020000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 1, 2, 4, 8
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38


CLONE_NEWUTS = 0x04000000


CLONE_NEWIPC = 0x08000000


CLONE_NEWUSER = 0x10000000


CLONE_NEWPID = 0x20000000


CLONE_NEWNET = 0x40000000


_SYSCALLS = {  # machine -> (pivot_root, mount_setattr, capset)
    "x86_64": (155, 442, 126),
    "aarch64": (41, 442, 91),
    "arm64": (41, 442, 91),
}


class _Libc:
    """The few libc entry points Python 3.11 lacks, via ctypes."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.numbers = _SYSCALLS.get(platform.machine())

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def unshare(self, flags: int) -> None:
        self._check(self.lib.unshare(ctypes.c_int(flags)), "unshare")

    def mount(
        self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
    ) -> None:
        def enc(value: str | None) -> bytes | None:
            return None if value is None else os.fsencode(value)

        result = self.lib.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
        self._check(result, f"mount {target}")

    def umount2(self, target: str, flags: int) -> None:
        self._check(self.lib.umount2(os.fsencode(target), ctypes.c_int(flags)), f"umount {target}")

    def prctl(self, option: int, arg: int) -> None:
        zero = ctypes.c_ulong(0)
        self._check(self.lib.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), zero, zero, zero), "prctl")

    def _syscall(self, index: int, *args: Any) -> int:
        if self.numbers is None:
            raise OSError(errno.ENOSYS, f"no syscall table for {platform.machine()}")
        return int(self.lib.syscall(ctypes.c_long(self.numbers[index]), *args))

    def pivot_root(self, new_root: str, put_old: str) -> None:
        self._check(self._syscall(0, os.fsencode(new_root), os.fsencode(put_old)), "pivot_root")

    def mount_setattr(self, path: str, attr_set: int, recursive: bool) -> None:
        attr = (ctypes.c_uint64 * 4)(attr_set, 0, 0, 0)
        flags = AT_RECURSIVE if recursive else 0
        result = self._syscall(
            1,
            ctypes.c_int(AT_FDCWD),
            os.fsencode(path),
            ctypes.c_uint(flags),
            ctypes.byref(attr),
            ctypes.c_size_t(32),
        )
        self._check(result, f"mount_setattr {path}")

    def drop_capabilities(self) -> None:
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        self._check(self._syscall(2, ctypes.byref(header), ctypes.byref(data)), "capset")


_libc: _Libc | None = None


def _lib() -> _Libc:
    global _libc
    if _libc is None:
        _libc = _Libc()
    return _libc


def new_pid_namespace() -> bool:
    """Put the caller's next child in a new PID namespace (its PID 1); False where not permitted.

    When that child ends, the kernel kills every process left in the namespace, ``setsid`` ones
    included. Only the first child after this call can be created: fork the runner once.
    """
    try:
        _lib().unshare(CLONE_NEWPID)
    except OSError:
        return False
    return True
