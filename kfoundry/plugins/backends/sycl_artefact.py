"""The compiled artefact of a SYCL program, for the measured behaviour descriptors.

The program is built by the runtime's kernel compiler as :meth:`SyclBackend.load` builds it (defines
after the last ``#include``), in a worker process of its own (``python -m
kfoundry.plugins.backends.sycl_artefact``, started on first use and kept): the kernel compiler runs
inside the runtime, and some programs crash it (``get_work_group_scratch_memory()`` segfaults this
one), which must not take the search loop down. A worker that dies is reported as a program that
does not build, and the next request starts a fresh one.

What comes back: each device image's backend content through
``sycl_ext_oneapi_device_image_backend_content`` (``ext_oneapi_get_backend_content()``: SPIR-V on the
OpenCL backend) and each free-function kernel's device-specific info (work-group size,
``compile_work_group_size``, preferred multiple, private memory, sub-groups, and the local memory
the OpenCL runtime reports through ``clGetKernelWorkGroupInfo``).
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import json
import os
import select
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from kfoundry.core.backend import CompileFailed
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.models import ParamValue

#: Seconds one build may take in the worker before it is killed (and the program counts as not built).
BUILD_TIMEOUT_S = 180.0

_lock = threading.Lock()
_worker: subprocess.Popen[bytes] | None = None
_contexts: dict[int, int] = {}


@dataclass
class Artefact:
    """A built program's device images (backend content) and its kernels' reports."""

    images: list[bytes] = field(default_factory=list)
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The device the program was built for, as the runtime reports it.
    device: dict[str, Any] = field(default_factory=dict)


def build_artefact(source: str, defines: dict[str, ParamValue], device_position: int = 0) -> Artefact:
    """Build ``source`` in the worker for the SYCL device at ``device_position`` and read its artefact.

    Raises :class:`BackendUnavailable` without a runtime or device, :class:`CompileFailed` (with the
    build log) when the program does not build or crashes the compiler, RuntimeError when the images
    cannot be read."""
    request = json.dumps({"source": source, "defines": defines, "device": device_position}) + "\n"
    with _lock:
        reply = _ask(request.encode())
    if reply.get("ok"):
        images = [base64.b64decode(i) for i in reply["images"]]
        return Artefact(images, reply["kernels"], reply["device"])
    kind, text = reply.get("kind"), str(reply.get("message", ""))
    if kind == "compile":
        raise CompileFailed(text, log=str(reply.get("log", "")))
    if kind == "unavailable":
        raise BackendUnavailable(text)
    raise RuntimeError(text)


def _ask(request: bytes) -> dict[str, Any]:
    global _worker
    if _worker is None or _worker.poll() is not None:
        _worker = subprocess.Popen(
            [sys.executable, "-m", "kfoundry.plugins.backends.sycl_artefact"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
    proc = _worker
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(request)
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], BUILD_TIMEOUT_S)
        line = proc.stdout.readline() if ready else b""
    except OSError:
        line = b""
    if line:
        reply: dict[str, Any] = json.loads(line)
        return reply
    if ready:  # end of file: the worker died on this program
        code = proc.wait(timeout=30)
        why = f"the SYCL kernel compiler crashed on this program (exit status {code})"
    else:
        proc.kill()
        proc.wait(timeout=30)
        why = f"the SYCL kernel compiler took more than {BUILD_TIMEOUT_S:.0f} s on this program"
    _worker = None
    return {"ok": False, "kind": "compile", "message": why}


@atexit.register
def _stop_worker() -> None:
    if _worker is not None and _worker.poll() is None and _worker.stdin is not None:
        _worker.stdin.close()  # the worker exits at the end of its input
        try:
            _worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _worker.kill()


# -- in the worker ------------------------------------------------------------------------------


def _context(position: int) -> tuple[Any, int, dict[str, Any]]:
    from kfoundry.plugins.backends.sycl_runtime import runtime, unavailable_reason
    from kfoundry.plugins.backends.sycl_shim import message

    rt = runtime()
    if not rt.devices:
        raise BackendUnavailable(unavailable_reason())
    info = rt.devices[position if 0 <= position < len(rt.devices) else 0]
    index = int(info["sycl_index"])
    if index not in _contexts:
        ctx = rt.lib.kf_open(index)
        if not ctx:
            raise BackendUnavailable(f"sycl: cannot open a context on {info['name']}: {message(rt.lib)}")
        _contexts[index] = int(ctx)
    return rt.lib, _contexts[index], info


def build_here(source: str, defines: dict[str, ParamValue], device_position: int = 0) -> Artefact:
    """:func:`build_artefact` in this process (the worker's side; a crash of the compiler ends it)."""
    from kfoundry.plugins.backends.sycl_shim import image_contents, message
    from kfoundry.plugins.backends.sycl_source import first_error, insert_defines, parse_kernels, source_lines

    lib, ctx, info = _context(device_position)
    text, first, count = insert_defines(source, defines)
    bundle = lib.kf_build(ctx, text.encode(), 0, (ctypes.c_char_p * 1)())
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


def _serve(request: dict[str, Any]) -> dict[str, Any]:
    try:
        art = build_here(
            str(request["source"]), dict(request.get("defines") or {}), int(request.get("device", 0))
        )
    except CompileFailed as exc:
        return {"ok": False, "kind": "compile", "message": str(exc), "log": exc.log}
    except BackendUnavailable as exc:
        return {"ok": False, "kind": "unavailable", "message": str(exc)}
    except Exception as exc:  # the reply must come back whatever went wrong
        return {"ok": False, "kind": "runtime", "message": f"{type(exc).__name__}: {exc}"}
    images = [base64.b64encode(i).decode() for i in art.images]
    return {"ok": True, "images": images, "kernels": art.kernels, "device": art.device}


def main() -> None:
    """Answer one JSON request per input line with one JSON line, until the input ends."""
    out = os.fdopen(
        os.dup(1), "w"
    )  # nothing but replies on the pipe: the runtime's own output goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if line.strip():
            out.write(json.dumps(_serve(json.loads(line))) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
