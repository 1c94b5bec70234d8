"""The judge's handle on its runner process: forking it into its namespaces, talking to it, stopping it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from kfoundry.core.evaluation import confine
from kfoundry.core.evaluation.channel import Channel, ChannelClosed, ChannelTimeout, channel_pair
from kfoundry.core.evaluation.jobs import EvalJob, JobResult, describe_exit
from kfoundry.core.evaluation.timer import _clock_ns
from kfoundry.core.models import Outcome


class JobFailed(Exception):
    """Ends the job with this result."""

    def __init__(self, result: JobResult) -> None:
        super().__init__(result.message)
        self.result = result


@contextlib.contextmanager
def device_lock(path: str | None) -> Iterator[None]:
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RunnerHandle:
    """The judge's grip on the runner process: commands, clock, freeze and kill."""

    def __init__(self, pid: int, chan: Channel, deadline: float, timeout_s: float) -> None:
        self.pid = pid
        self.chan = chan
        self.deadline = deadline
        self.timeout_s = timeout_s
        #: seconds this job waited for its device's lane (its deadline moved by them)
        self.waited_s = 0.0
        #: where the wait is told to the sandbox (``<result>.waited``), or None
        self.waited_path: str | None = None
        self.status: int | None = None
        self.frozen = False
        self._frozen_members: list[int] = [pid]
        #: answers a request (``op: compile``) the runner sends in place of a reply (the compile service)
        self.on_request: Callable[[dict[str, Any]], None] | None = None

    def _left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def receive(self) -> dict[str, Any]:
        reply = self._receive()
        while self.on_request is not None and reply.get("op") == "compile":
            self.on_request(reply)
            reply = self._receive()
        return reply

    def _receive(self) -> dict[str, Any]:
        try:
            return self.chan.recv(timeout=self._left())
        except ChannelTimeout:
            self.kill()
            raise JobFailed(
                JobResult(outcome=Outcome.timeout, message=f"timed out after {self.timeout_s:g} s (killed)")
            ) from None
        except ChannelClosed:
            raise JobFailed(self.crashed()) from None

    def exchange(
        self,
        message: dict[str, Any],
        fds: list[int] | None = None,
        settle: Callable[[], object] | None = None,
    ) -> tuple[dict[str, Any], int]:
        """Send ``message`` to the thawed runner, wait for its answer, freeze it: (answer, clocked ns).

        The clock starts before the runner is thawed and stops when the answer arrives, or, with
        ``settle`` (a GPU's idle probe), once the runner is frozen and ``settle`` has returned.
        """
        t0 = _clock_ns()
        self.thaw()
        try:
            self.chan.send(message, fds)
        except ChannelClosed:
            raise JobFailed(self.crashed()) from None
        reply = self.receive()
        if settle is None:
            elapsed = _clock_ns() - t0
            self.freeze()
            return reply, elapsed
        self.freeze()
        settle()
        return reply, _clock_ns() - t0

    def freeze(self) -> None:
        self._frozen_members = confine.freeze_tree(self.pid)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            confine.thaw_tree(self.pid, self._frozen_members)
            self.frozen = False

    def alive(self) -> bool:
        """Whether the runner still runs (reaps it if it ended)."""
        if self.status is not None:
            return False
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        self.status = status
        return False

    def crashed(self) -> JobResult:
        self.kill()
        return JobResult(
            outcome=Outcome.runtime_error,
            message=f"worker crashed: {describe_exit(self.status, 'the runner vanished')}",
        )

    def kill(self) -> None:
        if self.status is not None:
            with contextlib.suppress(Exception):
                confine.kill_tree(self.pid)
            return
        with contextlib.suppress(Exception):
            confine.kill_tree(self.pid)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            _, self.status = os.waitpid(self.pid, 0)


def fork_runner(job: EvalJob, deadline: float) -> RunnerHandle:
    from kfoundry.core.evaluation.runner_entry import runner_main

    own_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY)
    separate = confine.new_pid_namespace()
    judge_end, runner_end = channel_pair()
    pid = os.fork()
    if pid == 0:  # the runner: never returns
        judge_end.close()
        os.close(own_namespace)
        runner_main(runner_end, job)
    runner_end.close()
    if separate:  # back to our own namespace for later children: a process whose children would land
        # in another PID namespace cannot start threads (torch's OpenMP pool would fail)
        _setns(own_namespace)
    os.close(own_namespace)
    return RunnerHandle(pid, judge_end, deadline, job.evaluation.timeout_s)


def _setns(fd: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0x20000000) != 0:  # CLONE_NEWPID
        raise OSError(ctypes.get_errno(), "setns back to the judge's PID namespace failed")
