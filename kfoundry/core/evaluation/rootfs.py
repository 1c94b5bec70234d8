"""The runner's file system: a fresh root of read-only binds, a scratch directory, the devices it may open."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from kfoundry.core.evaluation.confine_plan import NOBODY, SCRATCH, ConfinementPlan, _Recorder
from kfoundry.core.evaluation.libc import (
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOEXEC,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    _lib,
)

_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


_GPU_DEVICE_DIRS = ("/dev/nvidia-caps", "/dev/dri")


_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc", "/opt")


_SPECIAL_ROOTS = ("/proc", "/sys", "/dev", SCRATCH, "/tmp")


MNT_DETACH = 2


def _home_dirs() -> list[str]:
    homes = {"/root", "/home"}
    with contextlib.suppress(KeyError, RuntimeError):
        homes.add(os.path.realpath(str(Path.home())))
    with contextlib.suppress(KeyError):
        homes.add(os.path.realpath(os.environ["HOME"]))
    return sorted(h for h in homes if h not in ("", "/"))


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _readable_paths(plan: ConfinementPlan, notes: list[str]) -> list[str]:
    """The host paths to bind read-only: system dirs, the Python trees, sys.path, extension dirs, plan.readable."""
    wanted: list[str] = [d for d in _SYSTEM_DIRS if os.path.lexists(d)]
    python = [sys.prefix, sys.base_prefix, sys.exec_prefix]
    python += [p for p in sys.path if p and os.path.isdir(p)]
    known = tuple(p.rstrip("/") + "/" for p in python)
    extra: set[str] = set()
    for finder in sys.meta_path:  # packages mapped by an import hook (setuptools' editable installs)
        mapping = getattr(sys.modules.get(getattr(finder, "__module__", "")), "MAPPING", None)
        if isinstance(mapping, dict):
            extra.update(p for p in mapping.values() if isinstance(p, str) and not p.startswith(known))
    with contextlib.suppress(
        OSError
    ):  # shared objects loaded from elsewhere (extension modules, their libraries)
        for line in Path("/proc/self/maps").read_text().splitlines():
            file = line[line.find("/") :] if "/" in line else ""
            if (file.endswith(".so") or ".so." in file) and not file.startswith(known + ("/usr/", "/lib")):
                extra.add(os.path.dirname(file))
    python += sorted(extra)
    homes = _home_dirs()
    for path in python:
        real = os.path.realpath(path)
        if real == "/" or any(_within(home, real) for home in homes):
            notes.append(f"filesystem: not exposing {path} (it would expose a home directory)")
            continue
        wanted.append(path)
    wanted += list(plan.readable)
    out: list[str] = []
    for path in wanted:
        absolute = os.path.abspath(path)
        real = os.path.realpath(absolute)
        if not os.path.exists(real):
            continue
        if any(_within(real, special) for special in _SPECIAL_ROOTS[:4]):
            notes.append(f"filesystem: not exposing {path} (inside {SCRATCH}, /proc, /sys or /dev)")
            continue
        if absolute != real and os.path.islink(absolute):
            out.append(absolute)  # recreated as a symlink
        out.append(real)
    return out


class _Root:
    """Builds the new root under ``base`` (a tmpfs), every bind read-only."""

    def __init__(self, base: str, notes: list[str]) -> None:
        self.base = base
        self.notes = notes
        self.lib = _lib()
        self.bound: list[tuple[str, bool, int]] = []  # (path, recursive, st_dev)

    def target(self, path: str) -> str:
        return self.base + path

    def covered(self, real: str) -> bool:
        with contextlib.suppress(OSError):
            dev = os.stat(real).st_dev
            return any(_within(real, p) and (rec or d == dev) for p, rec, d in self.bound)
        return True

    def makedirs(self, path: str) -> None:
        os.makedirs(self.target(path), mode=0o755, exist_ok=True)

    def symlink(self, path: str) -> None:
        with contextlib.suppress(OSError):
            if os.path.lexists(self.target(path)) or self.covered(os.path.dirname(path)):
                return
            self.makedirs(os.path.dirname(path))
            os.symlink(os.readlink(path), self.target(path))

    def protect(self, target: str, attrs: int, recursive: bool) -> None:
        """Make the mount at ``target`` read-only (plus ``attrs``), or remove it."""
        try:
            self.lib.mount_setattr(target, MOUNT_ATTR_RDONLY | attrs, recursive)
            return
        except OSError:
            pass
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for attr, flag in (
            (MOUNT_ATTR_NOSUID, MS_NOSUID),
            (MOUNT_ATTR_NODEV, MS_NODEV),
            (MOUNT_ATTR_NOEXEC, MS_NOEXEC),
        ):
            if attrs & attr:
                flags |= flag
        with contextlib.suppress(OSError):  # keep the flags the source mount has locked
            vfs = os.statvfs(target).f_flag
            flags |= vfs & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
        try:
            self.lib.mount(None, target, None, flags)
        except OSError:
            self.lib.umount2(target, MNT_DETACH)
            raise

    def bind(self, path: str, attrs: int = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) -> None:
        """Bind host ``path`` read-only at the same path in the new root."""
        try:
            if os.path.islink(path):
                self.symlink(path)
                return
            if self.covered(path):
                return
            st = os.stat(path)
            target = self.target(path)
            if stat.S_ISDIR(st.st_mode):
                self.makedirs(path)
            else:
                self.makedirs(os.path.dirname(path))
                if not os.path.lexists(target):
                    os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
            recursive = stat.S_ISDIR(st.st_mode) and self.lib.numbers is not None
            self.lib.mount(path, target, None, MS_BIND | (MS_REC if recursive else 0))
            self.protect(target, attrs, recursive)
            self.bound.append((path, recursive, st.st_dev))
        except OSError as exc:
            self.notes.append(f"filesystem: {path} not exposed ({exc.strerror or exc})")


def _mount_point() -> str:
    """An existing host directory to mount the new root on (hidden only inside this mount namespace)."""
    for candidate in ("/mnt", "/media", "/srv", "/dev/shm", "/tmp"):
        if os.path.isdir(candidate) and not os.path.islink(candidate):
            return candidate
    return "/tmp"


def _filesystem(rec: _Recorder, plan: ConfinementPlan) -> str | None:
    """Build the new root and enter it; the scratch path, or None when no new root could be made."""
    lib = _lib()
    notes: list[str] = []
    try:
        lib.mount(None, "/", None, MS_REC | MS_PRIVATE)
        base = _mount_point()
        paths = _readable_paths(plan, notes)
        hidden = [p for p in paths if _within(os.path.realpath(p), base) and not os.path.islink(p)]
        notes += [f"filesystem: not exposing {p} (under {base}, where the new root is built)" for p in hidden]
        paths = [p for p in paths if p not in hidden]
        lib.mount("kf-root", base, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    except OSError as exc:
        rec.fail("filesystem", f"cannot make a new root: {exc.strerror or exc}")
        rec.fail("scratch_cap", "no new root for the scratch tmpfs")
        return None
    root = _Root(base, notes)
    uid = plan.uid if plan.uid is not None else NOBODY
    owner = f",uid={uid},gid={uid}" if os.geteuid() == 0 else ""
    try:
        root.makedirs(SCRATCH)
        size = max(1, plan.scratch_mb)
        lib.mount(
            "kf-scratch",
            root.target(SCRATCH),
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"size={size}m,mode=0700{owner}",
        )
        for sub in ("home", "tmp", "shm", "pocl-cache"):
            os.mkdir(root.target(f"{SCRATCH}/{sub}"), 0o700 if sub != "tmp" else 0o1777)
            if owner:
                os.chown(root.target(f"{SCRATCH}/{sub}"), uid, uid)
        for sub, where in (("tmp", "/tmp"), ("shm", "/dev/shm")):
            root.makedirs(where)
            lib.mount(root.target(f"{SCRATCH}/{sub}"), root.target(where), None, MS_BIND)
        rec.in_force["scratch_cap"] = True
    except OSError as exc:
        rec.fail("scratch_cap", f"scratch tmpfs: {exc.strerror or exc}")
    for path in sorted(paths, key=lambda p: (p.count("/"), p)):
        root.bind(path)
    _devices(root, plan)
    _proc_and_sys(root, notes)
    if not _enter(root, rec):
        return None
    rec.in_force["filesystem"] = True
    rec.notes.extend(notes)
    return SCRATCH


def _devices(root: _Root, plan: ConfinementPlan) -> None:
    found = [d for d in _DEVICES if os.path.exists(d)]
    with contextlib.suppress(OSError):
        found += sorted("/dev/" + n for n in os.listdir("/dev") if n.startswith("nvidia") or n == "kfd")
    found += [d for d in _GPU_DEVICE_DIRS if os.path.isdir(d)]
    found += list(plan.devices)
    for dev in dict.fromkeys(found):
        root.bind(dev, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)
    for name, where in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        with contextlib.suppress(OSError):
            os.symlink(where, root.target(f"/dev/{name}"))


def _proc_and_sys(root: _Root, notes: list[str]) -> None:
    lib = _lib()
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    root.makedirs("/proc")
    try:
        lib.mount("proc", root.target("/proc"), "proc", flags)
    except OSError as exc:
        notes.append(f"filesystem: fresh /proc refused ({exc.strerror}); the host's is bound read-only")
        root.bind("/proc", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)
    root.makedirs("/sys")
    try:
        lib.mount("sysfs", root.target("/sys"), "sysfs", flags | MS_RDONLY)
    except OSError:
        root.bind("/sys", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)


def _enter(root: _Root, rec: _Recorder) -> bool:
    """pivot_root into the new root (chroot where that fails); make its top read-only."""
    lib = _lib()
    try:
        os.chdir(root.base)
        try:
            lib.pivot_root(".", ".")
            lib.umount2(".", MNT_DETACH)
        except OSError as exc:
            rec.notes.append(f"filesystem: pivot_root refused ({exc.strerror}), chroot used")
            os.chroot(".")
        os.chdir("/")
    except OSError as exc:
        rec.fail("filesystem", f"cannot enter the new root: {exc.strerror or exc}")
        return False
    try:
        lib.mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError as exc:
        rec.notes.append(f"filesystem: the new root's top stays writable ({exc.strerror})")
    return True


def _fallback_scratch(was_root: bool, uid: int) -> str:
    """A host temp dir standing in for the scratch tmpfs when there is no new root."""
    try:
        path = tempfile.mkdtemp(prefix="kf-scratch-")
        for sub in ("home", "tmp", "shm", "pocl-cache"):
            os.mkdir(os.path.join(path, sub), 0o700)
            if was_root:
                os.chown(os.path.join(path, sub), uid, uid)
        if was_root:
            os.chown(path, uid, uid)
        return path
    except OSError:
        return tempfile.gettempdir()
