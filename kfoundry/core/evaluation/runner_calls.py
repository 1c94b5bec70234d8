"""The runner's trusted calls: the device timer, its calibration, the trusted forward, CUDA IPC use."""

from __future__ import annotations

import time
from typing import Any

import torch

from kfoundry.core.backend import Backend
from kfoundry.core.evaluation.arena import dtype_name
from kfoundry.core.evaluation.device_share import RunnerShares
from kfoundry.core.evaluation.guard import ForwardGuard
from kfoundry.core.problem import Problem


def describe(value: Any) -> list[Any]:
    """Where one output lives: ``["tensor", address, dtype, shape, stride, device]`` or ``["other", type]``."""
    if type(value) is torch.Tensor:
        return [
            "tensor",
            int(value.data_ptr()),
            dtype_name(value.dtype),
            list(value.shape),
            list(value.stride()),
            str(value.device),
        ]
    return ["other", type(value).__name__]


def _device_timer(backend: Backend) -> Any:
    """The backend's device clock (device backends only), built before candidate code runs."""
    if backend.torch_device == "cpu":
        return None
    try:
        return backend.device_timer()
    except Exception:
        return None


def _calibration_call(timer: Any, backend: Backend) -> dict[str, Any]:
    """An empty timed call down the same path as a real one (guard, timer, a described and shared
    output), so the judge's calibration holds what every call costs besides the kernel."""
    if timer is None:
        return {"ok": True, "device_ms": []}
    shares = RunnerShares(backend.torch_device) if _ipc_usable(backend) else None
    with torch.no_grad(), ForwardGuard(poison_fresh=False):
        box: list[Any] = []
        device_ms = timer(lambda: box.append(torch.empty(1, device=backend.torch_device)))
    backend.synchronize()
    out = box[0]
    return {
        "ok": True,
        "device_ms": [device_ms],
        "outs": [[describe(out)]],
        "shares": [[shares.export(out) if shares is not None else None]],
        "launches": 0,
        "forbidden": [],
        "threads": [],
    }


def _ipc_usable(backend: Backend) -> bool:
    """Whether outputs and inputs cross by CUDA IPC (a CUDA backend with cuda-python)."""
    from kfoundry.core.evaluation import device_share

    return backend.torch_device.startswith("cuda") and device_share.available()


#: A kernel that does nothing: the trusted stand-in for a forward's launch in the timer's calibration.
NOOP_SOURCES = {"cuda": 'extern "C" __global__ void kf_noop(float* y) { if (y == 0) y[0] = 0.f; }'}


def _trusted_forward(backend: Backend, problem: Problem) -> Any:
    """A forward the runner trusts (built before candidate code runs): allocates an output like the
    problem's first and launches one no-op kernel through the backend, under the forward guard, as a
    candidate's forward does; None where the backend has no no-op kernel."""
    source = NOOP_SOURCES.get(backend.language)
    if source is None:
        return None
    noop = backend.load(source).kf_noop
    analysis = problem.analysis()
    shape = analysis.output_shapes[0] if analysis.output_shapes else [1]
    dtype = getattr(torch, analysis.output_dtypes[0]) if analysis.output_dtypes else torch.float32
    device = backend.torch_device

    def forward(*_args: Any) -> Any:
        out = torch.empty(shape, dtype=dtype, device=device)
        noop(out, grid=(1,), block=(32,))
        return out

    return forward


def _timer_overhead_ms(timer: Any, forward: Any = None) -> float | None:
    """Host time a device-timed call costs beyond its events (flush, spin, sync, and with ``forward`` an
    output allocation and one launch), measured before any candidate code runs, so the judge can tell
    honest events from faked ones."""
    if timer is None:
        return None
    extra: list[float] = []
    call = forward if forward is not None else (lambda: None)
    for _ in range(12):
        t0 = time.perf_counter()
        events = timer(call)
        extra.append((time.perf_counter() - t0) * 1e3 - events)
    return sorted(extra)[len(extra) // 2]


def cap_threads(threads: int) -> None:
    """At most ``threads`` CPU threads for torch and the OpenCL CPU runtime (PoCL) in this process: jobs
    run side by side (``executor.options.workers``) then share the cores instead of oversubscribing them."""
    import os

    torch.set_num_threads(threads)
    os.environ["POCL_MAX_PTHREAD_COUNT"] = str(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
