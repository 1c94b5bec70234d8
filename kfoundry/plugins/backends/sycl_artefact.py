"""The compiled artefact of a SYCL program, for the measured behaviour descriptors.

The program is built by the runtime's kernel compiler exactly as :meth:`SyclBackend.load` builds it
(defines after the last ``#include``), on a context of its own that lives as long as the process.
What comes back: each device image's backend content through
``sycl_ext_oneapi_device_image_backend_content`` (``ext_oneapi_get_backend_content()``: SPIR-V on the
OpenCL backend) and each free-function kernel's device-specific info (work-group size,
``compile_work_group_size``, preferred multiple, private memory, sub-groups, and the local memory
the OpenCL runtime reports through ``clGetKernelWorkGroupInfo``).
"""

from __future__ import annotations

import ctypes
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from kfoundry.core.backend import CompileFailed
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.models import ParamValue
from kfoundry.plugins.backends.sycl_runtime import runtime, unavailable_reason
from kfoundry.plugins.backends.sycl_shim import image_contents, message
from kfoundry.plugins.backends.sycl_source import first_error, insert_defines, parse_kernels, source_lines

_lock = threading.Lock()
_contexts: dict[int, int] = {}


@dataclass
class Artefact:
    """A built program's device images (backend content) and its kernels' reports."""

    images: list[bytes] = field(default_factory=list)
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The device the program was built for, as the runtime reports it.
    device: dict[str, Any] = field(default_factory=dict)


def _context(position: int) -> tuple[Any, int, dict[str, Any]]:
    rt = runtime()
    if not rt.devices:
        raise BackendUnavailable(unavailable_reason())
    info = rt.devices[position if 0 <= position < len(rt.devices) else 0]
    index = int(info["sycl_index"])
    with _lock:
        if index not in _contexts:
            ctx = rt.lib.kf_open(index)
            if not ctx:
                raise BackendUnavailable(f"sycl: cannot open a context on {info['name']}: {message(rt.lib)}")
            _contexts[index] = int(ctx)
        return rt.lib, _contexts[index], info


def build_artefact(source: str, defines: dict[str, ParamValue], device_position: int = 0) -> Artefact:
    """Build ``source`` for the SYCL device at ``device_position`` and read its artefact.

    Raises :class:`BackendUnavailable` without a runtime or device, :class:`CompileFailed` (with the
    build log) when the program does not build, RuntimeError when the images cannot be read."""
    lib, ctx, info = _context(device_position)
    text, first, count = insert_defines(source, defines)
    options = (ctypes.c_char_p * 1)()
    bundle = lib.kf_build(ctx, text.encode(), 0, options)
    log = source_lines(message(lib).strip(), first, count)
    if not bundle:
        raise CompileFailed(f"SYCL build failed: {first_error(log)}", log=log)
    try:
        out = Artefact(images=image_contents(lib, bundle), device=info)
        for sig in parse_kernels(source, defines):
            handle = lib.kf_get_kernel(bundle, sig.name.encode())
            if not handle:
                continue
            try:
                lib.kf_kernel_info(ctx, handle)
                out.kernels[sig.name] = json.loads(message(lib) or "{}")
            finally:
                lib.kf_release_kernel(handle)
        return out
    finally:
        lib.kf_release_bundle(bundle)
