"""A confined runner's process tree: its members (in and out of its PID namespace), freezing, thawing, killing."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of ``pid`` from /proc, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _pid_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _descendants(pid: int) -> list[int] | None:
    """``pid``'s descendants through ``/proc/<p>/task/<t>/children`` (None where the kernel lacks it)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as handle:
                    kids = [int(k) for k in handle.read().split()]
            except FileNotFoundError:
                if p == pid:
                    return None
                continue
            except (OSError, ValueError):
                continue
            for k in kids:
                if k not in found:
                    found.append(k)
                    stack.append(k)
    return found


def tree_members(pid: int) -> list[int]:
    """``pid`` and every process in its PID namespace (when it has its own) or its process group and descendants.

    When ``pid`` is the init of its own PID namespace, every member is its descendant (orphans are
    reparented to it or to a subreaper below it), so only its subtree is walked: the freeze and thaw
    around every timed call stay cheap however many processes the machine runs.
    """
    own = os.getpid()
    target_ns = _pid_ns(pid)
    if target_ns is not None and target_ns != _pid_ns("self") and _ns_pid(pid) == 1:
        kids = _descendants(pid)
        if kids is not None:
            return [pid] + sorted(set(kids) - {pid, own})
    pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    members = {pid}
    if target_ns is not None and target_ns != _pid_ns("self"):
        members.update(p for p in pids if _pid_ns(p) == target_ns)
    stats = {p: s for p in pids if (s := _proc_stat(p)) is not None}
    target = stats.get(pid)
    if target is not None and target[2] != os.getpgrp():
        members.update(p for p, s in stats.items() if s[2] == target[2])
    children: dict[int, list[int]] = {}
    for p, s in stats.items():
        children.setdefault(s[1], []).append(p)
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in members:
                members.add(child)
                stack.append(child)
    members.discard(own)
    return [pid] + sorted(members - {pid})


def _ns_pid(pid: int) -> int | None:
    """``pid``'s own number inside its innermost PID namespace (NSpid's last field)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def _stopped(pid: int) -> bool:
    """Every thread of ``pid`` stopped (or the process gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        if raw[raw.rfind(")") + 2] not in "TtZX":
            return False
    return True


def freeze_tree(pid: int, timeout_s: float = 1.0) -> list[int]:
    """SIGSTOP every member of ``pid``'s tree; return them once all are stopped (or after ``timeout_s``).

    A stopped process cannot fork, so the list returned is exactly what :func:`thaw_tree` must wake.
    """
    deadline = time.monotonic() + timeout_s
    seen: set[int] = set()
    while True:
        members = [p for p in tree_members(pid) if p not in seen]
        _signal_all(members, signal.SIGSTOP)
        seen.update(members)
        pending = [p for p in seen if not _stopped(p)]
        pause = 2e-5
        while pending and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.002)
            pending = [p for p in pending if not _stopped(p)]
        if time.monotonic() >= deadline or set(tree_members(pid)) <= seen:
            return [pid] + sorted(seen - {pid})


def thaw_tree(pid: int, members: list[int] | None = None) -> None:
    """SIGCONT every member of ``pid``'s tree (``members``: those a :func:`freeze_tree` returned)."""
    _signal_all(members if members is not None else tree_members(pid), signal.SIGCONT)


def kill_tree(pid: int) -> None:
    """SIGKILL every member of ``pid``'s tree (``pid`` first: as PID 1 of a namespace, that kills the rest)."""
    members = tree_members(pid)
    _signal_all(members[:1], signal.SIGKILL)
    _signal_all(members[1:], signal.SIGKILL)
