"""The run folder's single-writer lock, and the cause of a store failure in words."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from pydantic import ValidationError

from kfoundry.core.errors import StoreError


def describe_cause(exc: BaseException, path: Path | None = None) -> str:
    """An OS or SQLite error's cause in words (``disk full``, ``read-only``, ...), on one line.

    SQLite says only "disk I/O error" for some of these; the file system of ``path`` then tells.
    """
    text = " ".join(str(exc).split()) or type(exc).__name__
    low = text.lower()
    full = "disk is full" in low or getattr(exc, "errno", None) == errno.ENOSPC
    readonly = (
        "readonly" in low or "read-only" in low or getattr(exc, "errno", None) in (errno.EROFS, errno.EACCES)
    )
    if not (full or readonly) and path is not None:
        with contextlib.suppress(OSError):
            fs = os.statvfs(path if path.is_dir() else path.parent)
            readonly = bool(fs.f_flag & os.ST_RDONLY)
            full = not readonly and fs.f_bavail * fs.f_frsize < 64 * 1024
    if full:
        return f"the disk is full ({text})"
    if readonly:
        return f"the folder is read-only or not writable ({text})"
    return text


def first_error(exc: BaseException) -> str:
    """The first problem of a validation (or any) error, on one line of at most 200 characters."""
    if isinstance(exc, ValidationError) and exc.errors():
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}"[:200]
    return " ".join(str(exc).split())[:200] or type(exc).__name__


class RunLock:
    """An exclusive lock on a run folder (``flock`` on ``<store>.lock``): one writer at a time.

    Released when closed or when the holding process ends, however it ends (``kill -9`` included).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot lock {path}: {describe_cause(exc, path)}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            self._fd = None
            raise StoreError(
                f"{path.parent} is in use by another kf-run (pid {holder}): one writer per run folder; "
                "wait for it to finish or stop it"
            ) from None
        with contextlib.suppress(OSError):  # who holds it, for the message above (informational)
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
