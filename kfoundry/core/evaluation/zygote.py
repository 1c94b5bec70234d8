"""The sandbox's fork server: ``python -m kfoundry.core.evaluation.zygote``.

It imports torch, pyopencl and the worker once, then forks one child per job request, so a child
starts in milliseconds with a clean interpreter (no device context, no state from earlier jobs).
Protocol, one JSON object per line: stdin ``{"id", "job", "log", "result", "memory_mb"}``;
stdout ``{"id", "pid"}`` when the child started and ``{"id", "status"}`` (``os.waitpid`` status)
when it ended. The child writes its :class:`JobResult` JSON to the ``result`` path. On end of
input the server kills its children and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import sys
from typing import Any

import torch  # noqa: F401  (preloaded for the children)

from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.evaluation.worker import execute
from kfoundry.core.models import Outcome


def _child(request: dict[str, Any]) -> None:
    os.setsid()
    fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    limit = request.get("memory_mb")
    if limit:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (int(limit) * 2**20, int(limit) * 2**20))
    try:
        job = EvalJob.model_validate_json(request["job"])
        if job.backend_plugin:
            os.environ["KF_LOAD_PLUGINS"] = job.backend_plugin
        result = execute(job, runner_pid_file=request["result"] + ".runner")
    except MemoryError:
        result = JobResult(outcome=Outcome.runtime_error, message="out of memory (memory limit reached)")
    except BaseException as exc:  # the job must always answer
        result = JobResult(outcome=Outcome.runtime_error, message=f"worker: {type(exc).__name__}: {exc}")
    tmp = request["result"] + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(result.model_dump_json())
    os.replace(tmp, request["result"])
    os._exit(0)


def _send(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def _warm_up() -> None:
    """Import what the first dispatch mode would import lazily (torch._dynamo: seconds), once."""
    from kfoundry.core.evaluation.guard import ForwardGuard

    with ForwardGuard(poison_fresh=True):
        torch.empty(4)


def serve() -> None:
    """Read requests from stdin until it closes; fork a child per request; report pids and statuses."""
    _warm_up()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    children: dict[int, Any] = {}
    stdin = sys.stdin.buffer
    buffer = b""
    open_input = True
    while open_input or children:
        if open_input:
            ready, _, _ = select.select([stdin], [], [], 0.02)
            if ready:
                chunk = os.read(stdin.fileno(), 1 << 20)
                if not chunk:
                    open_input = False
                    for pid in children:
                        with contextlib.suppress(OSError):
                            os.killpg(pid, signal.SIGKILL)
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    request = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        out.close()
                        _child(request)
                    children[pid] = request["id"]
                    _send(out, {"id": request["id"], "pid": pid})
        else:
            select.select([], [], [], 0.02)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            job_id = children.pop(pid, None)
            if job_id is not None and open_input:
                _send(out, {"id": job_id, "status": status})


if __name__ == "__main__":
    serve()
