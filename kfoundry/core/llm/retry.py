"""Retry with exponential backoff and jitter, honouring ``Retry-After``.

The SDK clients are built with ``max_retries=0`` so that every attempt passes through here: each
attempt is visible (and recorded), and the policy is the same for every provider.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

T = TypeVar("T")

#: What went wrong in one attempt: the server answered with an error status or a malformed body,
#: could not be reached at all (refused, unknown host, reset), or did not answer in time.
FailureKind = Literal["status", "malformed", "connection", "timeout"]


class TransientError(Exception):
    """A failure worth retrying (429, 5xx, timeout, connection error, malformed 200)."""

    def __init__(self, message: str, retry_after: float | None = None, kind: FailureKind = "status") -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.kind: FailureKind = kind


class RetriesExhausted(Exception):
    """Every attempt failed with a transient error (``kinds``: each attempt's :data:`FailureKind`)."""

    def __init__(self, message: str, attempts: list[str], kinds: list[FailureKind] | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.kinds: list[FailureKind] = kinds if kinds is not None else ["status"] * len(attempts)

    @property
    def unreachable(self) -> bool:
        """Every attempt failed to connect: no server answers at that address."""
        return bool(self.kinds) and all(k == "connection" for k in self.kinds)

    @property
    def timed_out(self) -> bool:
        """The last attempt timed out."""
        return bool(self.kinds) and self.kinds[-1] == "timeout"


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` (or ``retry-after-ms``) header value; None if absent/unusable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


@dataclass
class RetryPolicy:
    """``max_retries`` retries after the first attempt; delays 0.5 s doubling up to ``max_delay``."""

    max_retries: int = 4
    base_delay: float = 0.5
    max_delay: float = 8.0
    #: Longest ``Retry-After`` honoured; longer requests are capped to this.
    max_retry_after: float = 60.0
    jitter: float = 0.25
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        base = min(self.base_delay * 2 ** (attempt - 1), self.max_delay)
        return base * (1 + self.jitter * self.rng.random())

    def call(self, fn: Callable[[], T], on_failure: Callable[[int, TransientError], None] | None = None) -> T:
        """Call ``fn`` until it succeeds or the retries run out (:class:`RetriesExhausted`)."""
        errors: list[str] = []
        kinds: list[FailureKind] = []
        for attempt in range(self.max_retries + 1):
            try:
                return fn()
            except TransientError as exc:
                errors.append(str(exc))
                kinds.append(exc.kind)
                if on_failure is not None:
                    on_failure(attempt + 1, exc)
                if attempt == self.max_retries:
                    break
                self.sleep(self.delay(attempt + 1, exc.retry_after))
        raise RetriesExhausted(f"{len(errors)} attempts failed; last: {errors[-1]}", errors, kinds)
