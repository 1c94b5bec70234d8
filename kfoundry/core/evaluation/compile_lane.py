"""The device's lane as the judge holds it: one lock per physical device around correctness and timing,
given up while the judge compiles a candidate's program that is not in the cache.

A compile request that arrives while the job holds the lane (a ``load`` inside ``forward``) would
otherwise keep every other job off the device for the compile's length. The runner synchronizes its
device before it asks (its harness does, in :class:`~.compile_service.RemoteCompiler`), the judge
freezes it while it compiles, so the lane can be released for the compile and re-taken afterwards.
During timing it is not released (:attr:`DeviceLane.releasable` is False): a compile there stays
inside the lane and on the candidate's own clock.

Time spent blocked on the lock is not the candidate's: :attr:`DeviceLane.on_wait` hears each wait, and the
job's deadline moves by it (a hanging job ahead in the lane cannot push an honest one into a timeout).
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from typing import IO, Any


class DeviceLane:
    """The lane lock at ``path`` (None: no lock; nothing to release), with the intervals it was given up."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.releasable = True
        #: wall-clock (epoch seconds) intervals during which the lane was released for a compile
        self.released: list[tuple[float, float]] = []
        self._handle: IO[Any] | None = None
        #: seconds spent blocked on the lock in all (taking it, and taking it back after a compile)
        self.waited_s = 0.0
        #: told when a wait begins (its ``time.monotonic`` start) and ends (None): the job moves its
        #: deadline by :attr:`waited_s` and tells the sandbox
        self.on_wait: Callable[[float | None], None] | None = None

    @property
    def held(self) -> bool:
        return self._handle is not None

    def __enter__(self) -> DeviceLane:
        if self.path:
            handle = open(self.path, "a")  # noqa: SIM115 (held across the with block and re-locked)
            self._lock(handle)
            self._handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    @contextlib.contextmanager
    def released_for_compile(self) -> Iterator[bool]:
        """Release the lane for the block if it is held and may be (yields whether it was)."""
        handle = self._handle
        if handle is None or not self.releasable:
            yield False
            return
        start = time.time()  # before the unlock: another job may take the lane at once
        fcntl.flock(handle, fcntl.LOCK_UN)
        try:
            yield True
        finally:
            self._lock(handle)
            self.released.append((start, time.time()))

    def _lock(self, handle: IO[Any]) -> None:
        """Take the lock, counting the time blocked on it (``on_wait`` hears when a wait begins, with
        its ``time.monotonic`` start, and when it ends, with None)."""
        try:  # free: no wait to tell
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        begun = time.monotonic()
        if self.on_wait is not None:
            self.on_wait(begun)
        fcntl.flock(handle, fcntl.LOCK_EX)
        self.waited_s += time.monotonic() - begun
        if self.on_wait is not None:
            self.on_wait(None)

    def released_s(self) -> float:
        """Seconds the lane was released in all."""
        return sum(b - a for a, b in self.released)

    def phase_times(self) -> dict[str, tuple[float, float]]:
        """``lane_released_<i>`` intervals for :attr:`~.jobs.JobResult.phase_times`."""
        return {f"lane_released_{i}": span for i, span in enumerate(self.released)}
