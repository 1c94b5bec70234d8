"""OS-level confinement of the untrusted runner process (Linux namespaces, a new root, rlimits).

The judge calls :func:`new_pid_namespace` and forks the runner, which becomes PID 1 of a fresh PID
namespace; the runner, still single-threaded, calls :func:`confine` before running candidate code:

1. new mount, network, IPC and UTS namespaces (a user namespace first when not root);
2. a new root (a tmpfs) holding read-only binds of the system and Python trees, ``sys.path``, the
   imported extension modules' directories and ``plan.readable``; a fresh ``/proc``, a read-only
   ``/sys``, a minimal ``/dev``; one size-capped tmpfs as the only writable place (``/scratch``,
   with ``/tmp`` and ``/dev/shm`` inside it); ``pivot_root`` (``chroot`` where that fails);
3. root drops to ``nobody`` (65534); ``PR_SET_NO_NEW_PRIVS``; the process stays dumpable so a root
   judge can read its memory through ``/proc/<pid>/mem``;
4. rlimits; 5. an environment rebuilt from an allow-list; 6. every fd closed but 0, 1, 2 and
   ``plan.keep_fds``.

Nothing here raises for a missing facility: each protection not in force is reported with why.
:func:`probe` forks a confined child and tests each protection for real (``kf-run doctor``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import resource
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from kfoundry.core.evaluation.confine_plan import (
    DEFAULT_ENV_ALLOW,
    NOBODY,
    PROTECTIONS,
    SCRATCH,
    ConfinementPlan,
    ConfinementReport,
    Protection,
    _Recorder,
    env_allowed,
)
from kfoundry.core.evaluation.libc import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    _lib,
    new_pid_namespace,
)
from kfoundry.core.evaluation.process_tree import freeze_tree, kill_tree, thaw_tree, tree_members
from kfoundry.core.evaluation.rootfs import (
    _fallback_scratch,
    _filesystem,
)

__all__ = [
    "DEFAULT_ENV_ALLOW",
    "PROTECTIONS",
    "SCRATCH",
    "ConfinementPlan",
    "ConfinementReport",
    "Protection",
    "confine",
    "env_allowed",
    "freeze_tree",
    "kill_tree",
    "new_pid_namespace",
    "thaw_tree",
    "tree_members",
    "warn_missing_once",
]


#: The uid (and gid) the runner drops to; set per call of :func:`confine` (ConfinementPlan.uid).
_uid = NOBODY


def confine(plan: ConfinementPlan) -> ConfinementReport:
    """Confine the calling (single-threaded, freshly forked) process; never raises for a missing facility."""
    global _uid
    _uid = plan.uid if plan.uid is not None else NOBODY
    rec = _Recorder()
    if os.getpid() == 1 and os.getppid() == 0:
        rec.in_force["pid_namespace"] = True
    else:
        rec.fail(
            "pid_namespace", "not PID 1 of its own PID namespace (new_pid_namespace() refused or not called)"
        )
    was_root = os.geteuid() == 0
    scratch = None
    with _step(rec, "filesystem", "scratch_cap"):
        if _namespaces(rec, was_root):
            scratch = _filesystem(rec, plan)
    if plan.loopback and rec.in_force.get("network"):
        _loopback_up(rec)
    if scratch is None:
        scratch = _fallback_scratch(was_root, _uid)
    with _step(rec, "unprivileged", "no_new_privs"):
        _drop_privileges(rec, was_root)
    with _step(rec, "limits"):
        _limits(rec, plan)
    with _step(rec, "environment"):
        _environment(rec, plan, scratch)
    with contextlib.suppress(OSError):
        os.chdir(scratch)
    with _step(rec):
        _close_fds(plan.keep_fds)
    return ConfinementReport(scratch=scratch, in_force=rec.in_force, notes=rec.notes)


@contextlib.contextmanager
def _step(rec: _Recorder, *names: str) -> Iterator[None]:
    """Run one step; an unexpected error marks ``names`` not in force instead of propagating."""
    try:
        yield
    except Exception as exc:
        for name in names or ("filesystem",):
            if not any(note.startswith(name + ":") for note in rec.notes):
                rec.fail(name, f"{type(exc).__name__}: {exc}")
            rec.in_force[name] = False


def _namespaces(rec: _Recorder, was_root: bool) -> bool:
    """Unshare mount, network, IPC and UTS namespaces; True when a private mount namespace exists."""
    lib = _lib()
    if not was_root:
        uid, gid = os.getuid(), os.getgid()
        try:
            lib.prctl(PR_SET_DUMPABLE, 1)  # else /proc/self/uid_map is root's
            lib.unshare(CLONE_NEWUSER)
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        except OSError as exc:
            rec.notes.append(f"user namespace: {exc.strerror or exc}")
    wanted = {CLONE_NEWNS: "mount", CLONE_NEWNET: "network", CLONE_NEWIPC: "ipc", CLONE_NEWUTS: "uts"}
    try:
        lib.unshare(sum(wanted))
        done = set(wanted)
    except OSError:
        done = set()
        for flag in wanted:
            with contextlib.suppress(OSError):
                lib.unshare(flag)
                done.add(flag)
    if CLONE_NEWNET in done:
        rec.in_force["network"] = True
    else:
        rec.fail("network", "unshare(CLONE_NEWNET) not permitted")
    if CLONE_NEWNS not in done:
        rec.fail("filesystem", "unshare(CLONE_NEWNS) not permitted")
        rec.fail("scratch_cap", "no mount namespace for the scratch tmpfs")
        return False
    return True


def _loopback_up(rec: _Recorder) -> None:
    """Set ``lo`` up in the (private) network namespace: reachable from this namespace only."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            fcntl.ioctl(sock, 0x8914, struct.pack("16sH22x", b"lo", 0x1 | 0x8 | 0x40))  # SIOCSIFFLAGS
    except OSError as exc:
        rec.notes.append(f"loopback: {exc.strerror or exc}")


def _cap_eff() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return None


def _drop_privileges(rec: _Recorder, was_root: bool) -> None:
    lib = _lib()
    why = ""
    try:
        if was_root:
            os.setgroups([])
            os.setgid(_uid)
            os.setuid(_uid)
        else:
            lib.drop_capabilities()  # those the user namespace gave
    except OSError as exc:
        why = f"cannot drop privileges: {exc.strerror or exc}; "
    with contextlib.suppress(OSError):
        lib.prctl(PR_SET_DUMPABLE, 1)  # the judge reads our memory through /proc/<pid>/mem
    caps = _cap_eff()
    if not why and os.getuid() != 0 and os.geteuid() != 0 and caps == 0:
        rec.in_force["unprivileged"] = True
    else:
        rec.fail(
            "unprivileged",
            f"{why}uid {os.getuid()}, effective capabilities {caps if caps is None else hex(caps)}",
        )
    try:
        lib.prctl(PR_SET_NO_NEW_PRIVS, 1)
        rec.in_force["no_new_privs"] = True
    except OSError as exc:
        rec.fail("no_new_privs", f"prctl(PR_SET_NO_NEW_PRIVS): {exc.strerror}")


def _limits(rec: _Recorder, plan: ConfinementPlan) -> None:
    wanted = [
        (resource.RLIMIT_NPROC, plan.max_processes),
        (resource.RLIMIT_NOFILE, plan.max_open_files),
        (resource.RLIMIT_FSIZE, plan.max_file_mb * 2**20),
        (resource.RLIMIT_CORE, 0),
    ]
    if plan.memory_mb is not None:
        wanted.append((resource.RLIMIT_AS, plan.memory_mb * 2**20))
    if plan.cpu_seconds is not None:
        wanted.append((resource.RLIMIT_CPU, plan.cpu_seconds))
    failed: list[str] = []
    for which, value in wanted:
        try:
            _, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError) as exc:
            failed.append(f"{which}: {exc}")
    if failed:
        rec.fail("limits", "setrlimit failed for " + ", ".join(failed))
    else:
        rec.in_force["limits"] = True


def _environment(rec: _Recorder, plan: ConfinementPlan, scratch: str) -> None:
    kept = {k: v for k, v in os.environ.items() if env_allowed(k, plan.env_allow)}
    kept.update(HOME=f"{scratch}/home", TMPDIR=f"{scratch}/tmp", POCL_CACHE_DIR=f"{scratch}/pocl-cache")
    kept.update(plan.env_set)
    os.environ.clear()  # (on POSIX this is also posix.environ)
    with contextlib.suppress(AttributeError):
        _lib().lib.clearenv()
    _scrub_startup_environment()
    os.environ.update(kept)
    tempfile.tempdir = None  # recomputed from TMPDIR
    rec.in_force["environment"] = True


def _scrub_startup_environment() -> None:
    """Zero the environment strings exec left on the stack (what /proc/self/environ shows)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        raw = Path("/proc/self/stat").read_text()
        fields = raw[raw.rfind(")") + 2 :].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50 and 51)
        if 0 < start < end and end - start < 2**20:
            ctypes.memset(start, 0, end - start)


def _close_fds(keep: Iterable[int]) -> None:
    kept = sorted({fd for fd in keep if fd > 2})
    try:
        top = max(int(n) for n in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        top = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    low = 3
    for fd in kept:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(low, top))


_warned = False


def warn_missing_once(report: ConfinementReport) -> None:
    """Warn once per process (one line) naming the protections not in force."""
    global _warned
    missing = report.missing()
    if _warned or not missing:
        return
    _warned = True
    warnings.warn(
        f"sandbox: not in force: {', '.join(missing)} (run `kf-run doctor`)", RuntimeWarning, stacklevel=2
    )


# --- probe -------------------------------------------------------------------------------------
