"""What a candidate's ``ModelNew`` imports: ``load(source, defines=PARAMS)`` compiles kernel source on
the active backend and returns a :class:`~kfoundry.core.backend.KernelModule`::

    from kfoundry.runtime import LocalMemory, cdiv, load
    SRC = '''__kernel void add(__global const float* a, __global const float* b,
                               __global float* c, int n) { ... }'''
    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = load(SRC, defines=PARAMS)
        def forward(self, a, b):
            c = torch.empty_like(a)
            self.k.add(a, b, c, a.numel(), grid=(cdiv(a.numel(), PARAMS["BLOCK"]),), block=(PARAMS["BLOCK"],))
            return c

The evaluation harness sets the active backend (:func:`set_backend`) and injects ``PARAMS``; used
outside the harness, ``load`` builds the ``opencl`` backend on its first device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from kfoundry.core.backend import Backend, KernelModule
from kfoundry.core.models import ParamValue

_lock = threading.Lock()
_active: Backend | None = None


def set_backend(backend: Backend | None) -> None:
    """Make ``backend`` the one :func:`load` compiles for (None: forget it)."""
    global _active
    with _lock:
        _active = backend


def active_backend() -> Backend:
    """The active backend; builds the default (``opencl``, first device) if none was set."""
    global _active
    with _lock:
        if _active is None:
            from kfoundry.core.plugins import get_plugin

            backend = get_plugin("backend", "opencl").build({})
            backend.require_device()
            _active = backend
        return _active


def load(
    source: str,
    defines: dict[str, ParamValue] | None = None,
    build_options: list[str] | None = None,
) -> KernelModule:
    """Compile ``source`` on the active backend (raises ``CompileFailed`` with the compiler log)."""
    return active_backend().load(source, defines=defines, build_options=build_options)


def synchronize() -> None:
    """Wait for all work queued on the active backend's device."""
    active_backend().synchronize()


@dataclass(frozen=True)
class LocalMemory:
    """A kernel argument of ``nbytes`` of work-group local (shared) memory: ``__local float* scratch``
    on OpenCL. Pass ``LocalMemory(BLOCK * 4)`` where the kernel takes a ``__local`` pointer."""

    nbytes: int


def cdiv(a: int, b: int) -> int:
    """Ceiling division, for grid sizes."""
    return -(-int(a) // int(b))
