"""The runner process's entry: confine, start the backend, let the judge calibrate, then build and serve.

Everything before the marked line runs before any candidate code (see ``runner.py`` for the commands).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from typing import Any, NoReturn

from kfoundry import runtime
from kfoundry.core.evaluation import audit_guard
from kfoundry.core.evaluation.channel import Channel, ChannelClosed
from kfoundry.core.evaluation.compile_service import RemoteCompiler, runner_compile_info
from kfoundry.core.evaluation.jobs import EvalJob
from kfoundry.core.evaluation.runner import Runner, build_backend, refused_or
from kfoundry.core.evaluation.runner_calls import (
    _calibration_call,
    _device_timer,
    _ipc_usable,
    _timer_overhead_ms,
    _trusted_forward,
    cap_threads,
)
from kfoundry.core.problem import load_problem


def _die_with_parent() -> None:
    """SIGKILL this process when the judge dies (first line; the judge's supervisor also kills it)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def runner_main(chan: Channel, job: EvalJob) -> NoReturn:
    """Entry of the forked runner process: never returns."""
    from kfoundry.core.evaluation import confine

    status = 0
    try:
        _die_with_parent()
        setup = chan.recv()
        variants: list[dict[str, Any]] = setup["variants"]
        problems = [load_problem(job.problem_path, shapes) for shapes in variants]
        readable = tuple(sorted({str(p.path.resolve()) for p in problems} | set(setup.get("readable", []))))
        ev = job.evaluation
        plan = confine.ConfinementPlan(
            scratch_mb=ev.scratch_mb,
            readable=readable,
            keep_fds=(chan.fileno(),),
            memory_mb=None if job.on_gpu or job.backend == "cuda" else ev.memory_limit_mb,
            max_processes=ev.max_processes,
            uid=int(setup["uid"]) if isinstance(setup.get("uid"), int) else None,
        )
        report = confine.confine(plan)
        _die_with_parent()  # again: changing credentials clears the parent-death signal
        # after confinement: runtimes read their cache and temp dirs from the (now sandboxed) environment
        if job.threads:
            cap_threads(job.threads)
        backend = build_backend(job)
        runtime.set_backend(backend)
        timer = _device_timer(backend) if job.kind != "compile" else None  # a compile job times nothing
        forward = None
        if timer is not None:
            with contextlib.suppress(Exception):  # no trusted forward: the empty call calibrates
                forward = _trusted_forward(backend, problems[0])
        chan.send(
            {
                "op": "ready",
                "torch_device": backend.torch_device,
                "in_force": report.in_force,
                "notes": report.notes,
                "timer_overhead_ms": _timer_overhead_ms(timer, forward),
                "ipc": _ipc_usable(backend),
                "compile": runner_compile_info(backend),
            }
        )
        calibration: Runner | None = None
        while True:  # the judge measures what an exchange costs while nothing untrusted runs here
            message = chan.recv()
            if message.get("op") != "calibrate":
                break
            calls = int(message.get("calls") or 0)
            if calls and forward is not None:
                # the real call path (guard, timer, outputs described and shared) on the trusted forward
                if calibration is None:
                    calibration = Runner(chan, job, problems, backend, timer)
                    calibration.models, calibration.slots = [forward], [[]]
                chan.send(calibration.call(0, [0] * calls, device_timing=True))
            else:
                chan.send(_calibration_call(timer, backend))
        # -- from here on, candidate code runs ----------------------------------------------------
        remote = (
            RemoteCompiler(chan, backend, discover=job.kind == "compile")
            if message.get("compile_service") is True
            else None
        )
        if remote is not None:  # kernels compiled by the judge's confined compile step (and its cache)
            backend.load = remote  # type: ignore[method-assign]
        runner = Runner(chan, job, problems, backend, timer)
        if job.kind == "evaluate":
            audit_guard.arm()  # no way back: the hook stays for the runner's life
        built = runner.build()  # loads inside later calls go through the judge too (``remote``)
        chan.send(refused_or(built))
        runner.serve()
    except ChannelClosed:
        status = 3
    except BaseException as exc:  # the runner must always answer or die
        with contextlib.suppress(Exception):
            chan.send(
                {
                    "error": f"runner: {type(exc).__name__}: {exc}",
                    "kind": "runtime_error",
                    "log": traceback.format_exc()[-4000:],
                }
            )
        status = 4
    os._exit(status)
