"""The profiling pass: a correct candidate's achieved traffic from ``ncu``, with ncu and the candidate
both inside one confinement.

:func:`profile_candidate` (the loop's side) takes the device's lane, starts a fresh server process with
the fork server's allow-listed environment (no API key ever enters it), which forks a child into a new
PID namespace; the child confines itself as the runner does (mount, network with only its own
loopback up, IPC and UTS namespaces, a new root, a scratch tmpfs, a uid of its own, no_new_privs,
rlimits) and runs ``ncu --csv ... python -m kfoundry.core.evaluation.profile_target``. ncu's
``--log-file`` lies in the scratch; the child sends it back through a pipe, capped.

What comes back is the candidate's to forge (it shares the child's uid and scratch): it is parsed as
plain text, bounded, and only places the kernel in the archive; no verdict or time depends on it.
Where ncu is missing, refused (``ERR_NVGPUCTRPERM``: the driver lets only administrators read the
counters, and the sandbox's user is none), fails or times out, the result says why in one line and
the static estimates stand.

    python -m kfoundry.core.evaluation.profile NCU < job.json     # the server (internal)
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfoundry.core.behaviour.traffic import NCU_METRICS, NcuOutputError, parse_ncu_csv
from kfoundry.core.evaluation.jobs import EvalJob, lane_lock_path

MAX_ANSWER = 1 << 22
#: Kernel launches ncu profiles at most in one call of ``forward``.
MAX_LAUNCHES = 64

_NCU_GLOBS = (
    "/usr/local/cuda*/bin/ncu",
    "/usr/local/cuda*/nsight-compute*/ncu",
    "/opt/nvidia/nsight-compute/*/ncu",
    "/usr/local/NVIDIA-Nsight-Compute*/ncu",
)


@dataclass
class ProfileResult:
    """Summed ncu metrics of one call of the candidate's ``forward``, or why there are none."""

    metrics: dict[str, float] = field(default_factory=dict)
    launches: int = 0
    #: One line when nothing was measured (the static estimates stand), else None.
    warning: str | None = None
    wall_s: float = 0.0
    #: Whether the reason holds for every candidate (ncu is missing): no use trying again.
    permanent: bool = False
    #: The tail of ncu's own output (for a diagnosis).
    detail: str = ""


def find_ncu() -> str | None:
    """``$KF_NCU``, ``ncu`` on PATH, or the toolkit's and Nsight Compute's usual places."""
    named = os.environ.get("KF_NCU")
    if named:
        return named if os.access(named, os.X_OK) else None
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in _NCU_GLOBS:
        for path in sorted(glob.glob(pattern), reverse=True):
            if os.access(path, os.X_OK):
                return path
    return None


def ncu_command(ncu: str, log_file: str, target: list[str]) -> list[str]:
    """The ncu command line of the profiling pass (metrics of :data:`NCU_METRICS`, CSV in ``log_file``)."""
    return [
        ncu,
        "--csv",
        "--page",
        "details",
        "--print-units",
        "base",
        "--clock-control",
        "none",
        "--target-processes",
        "all",
        "--launch-count",
        str(MAX_LAUNCHES),
        "--metrics",
        ",".join(NCU_METRICS),
        "--log-file",
        log_file,
        *target,
    ]


def profile_candidate(job: EvalJob, timeout_s: float = 45.0) -> ProfileResult:
    """Profile ``job``'s candidate under ncu in the sandbox (see the module docstring); never raises.

    Only a missing ncu is ``permanent``: what comes back from the sandbox (a refusal, a timeout) may be
    the candidate's doing, so the run gives up only after several in a row (``profiling.py``).
    """
    from kfoundry.core.evaluation.runner_handle import device_lock
    from kfoundry.core.evaluation.sandbox import _server_environment

    start = time.monotonic()
    ncu = find_ncu()
    if ncu is None:
        return ProfileResult(
            warning="profile: ncu not found (PATH, $KF_NCU, /usr/local/cuda*/bin)", permanent=True
        )
    env = _server_environment()
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    try:
        with device_lock(lane_lock_path(job)):
            proc = subprocess.run(
                [sys.executable, "-m", "kfoundry.core.evaluation.profile", ncu, str(timeout_s)],
                input=job.model_dump_json().encode(),
                capture_output=True,
                env=env,
                timeout=timeout_s + 20,
            )
    except subprocess.TimeoutExpired:
        return ProfileResult(
            warning=f"profile: timed out after {timeout_s:g} s", wall_s=time.monotonic() - start
        )
    try:
        answer = json.loads(proc.stdout[:MAX_ANSWER] or b"{}")
    except ValueError:
        answer = {}
    if not isinstance(answer, dict) or not answer:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no answer"]
        return ProfileResult(warning=f"profile: the profiling sandbox failed: {tail[0][:200]}")
    result = interpret(answer)
    result.wall_s = time.monotonic() - start
    result.detail = str(answer.get("output", answer.get("error", "")))[-2000:]
    return result


def interpret(answer: dict[str, Any]) -> ProfileResult:
    """A :class:`ProfileResult` from the sandbox's answer (``csv``, ``output``, ``rc``, ``error``)."""
    output = str(answer.get("output", ""))
    text = str(answer.get("csv", ""))
    if "ERR_NVGPUCTRPERM" in output + text:
        return ProfileResult(
            warning="profile: ncu was refused the GPU performance counters (ERR_NVGPUCTRPERM) as the sandbox's "
            "user: the driver restricts them to administrators; the static traffic estimates stand"
        )
    survivors = answer.get("survivors")
    if isinstance(survivors, list) and survivors:
        return ProfileResult(
            warning=f"profile: {len(survivors)} process(es) of the candidate outlived ncu "
            f"({', '.join(map(str, survivors))[:100]}): its traffic could be rewritten, not used"
        )
    if answer.get("error") or answer.get("rc") == -1:
        error = str(answer.get("error") or output)
        return ProfileResult(warning=f"profile: {error[:300]}")
    for source in (text, output):
        with contextlib.suppress(NcuOutputError):
            metrics, launches = parse_ncu_csv(source)
            return ProfileResult(metrics=metrics, launches=launches)
    last = [ln for ln in output.splitlines() if ln.strip()][-1:] or [f"exit status {answer.get('rc')}"]
    return ProfileResult(warning=f"profile: ncu reported no metrics: {last[0][:300]}")


# -- the server and its confined child ------------------------------------------------------------------


def serve(ncu: str, timeout_s: float) -> None:
    """Read the job from stdin, run the confined child, print its answer (JSON) on stdout."""
    from kfoundry.core.evaluation import confine

    job = EvalJob.model_validate_json(sys.stdin.buffer.read())
    read_end, write_end = os.pipe()
    confine.new_pid_namespace()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _child(job, ncu, timeout_s, write_end)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s + 10
    answer: dict[str, Any] = {}
    try:
        while sum(map(len, chunks)) <= MAX_ANSWER:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                answer = {"error": f"timed out after {timeout_s:g} s (killed)"}
                break
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
    if not answer:
        try:
            answer = json.loads(b"".join(chunks)[:MAX_ANSWER])
        except ValueError:
            answer = {"error": "the profiling sandbox died without an answer"}
    sys.stdout.write(json.dumps(answer if isinstance(answer, dict) else {"error": "malformed answer"}))


def _child(job: EvalJob, ncu: str, timeout_s: float, out: int) -> None:
    from kfoundry.core.evaluation import confine
    from kfoundry.core.evaluation.libc import PR_SET_DUMPABLE, _lib

    answer: dict[str, Any]
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the server's stdout is its answer: nothing in here may write to it
            os.dup2(null, fd)
        plan = confine.ConfinementPlan(
            scratch_mb=job.evaluation.scratch_mb,
            readable=(str(Path(job.problem_path).resolve()), os.path.dirname(os.path.realpath(ncu))),
            keep_fds=(out,),
            max_processes=512,
            max_open_files=1024,
            uid=3_600_000 + os.getpid() % 1_000_000,
            loopback=True,
        )
        report = confine.confine(plan)
        with contextlib.suppress(OSError):  # the candidate shares the uid: no /proc/1/fd, /proc/1/mem for it
            _lib().prctl(PR_SET_DUMPABLE, 0)
        scratch = Path(report.scratch)
        (scratch / "job.json").write_text(job.model_dump_json())
        log_file = str(scratch / "ncu.csv")
        target = [sys.executable, "-m", "kfoundry.core.evaluation.profile_target", str(scratch / "job.json")]
        try:
            proc = subprocess.run(
                ncu_command(ncu, log_file, target),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
            output, rc = proc.stdout[-20000:].decode(errors="replace"), proc.returncode
        except subprocess.TimeoutExpired:
            output, rc = f"ncu timed out after {timeout_s:g} s", -1
        survivors = _survivors(ncu)  # a process of the candidate left running could rewrite the log
        if os.getpid() == 1:
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)  # every other process of this PID namespace
        csv_text = ""
        with contextlib.suppress(OSError), open(log_file, "rb") as handle:
            csv_text = handle.read(MAX_ANSWER // 2).decode(errors="replace")
        answer = {
            "rc": rc,
            "csv": csv_text,
            "output": output,
            "unconfined": report.missing(),
            "survivors": survivors[:5],
        }
    except BaseException as exc:
        answer = {"error": f"profiling sandbox: {type(exc).__name__}: {exc}"[:2000]}
    with contextlib.suppress(OSError):
        view = memoryview(json.dumps(answer).encode())
        while view:
            view = view[os.write(out, view) :]
    os._exit(0)


def _survivors(ncu: str) -> list[str]:
    """Names of the processes still running in this PID namespace after ncu returned, other than
    this one and ncu's own helpers (executables inside its installation); zombies are reaped first."""
    if os.getpid() != 1:
        return []  # no PID namespace of our own: /proc shows the host's processes
    with contextlib.suppress(ChildProcessError, OSError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    own = (os.path.dirname(os.path.realpath(ncu)),)
    found: list[str] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == "1":
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            exe = os.path.realpath(f"/proc/{name}/exe")
        except OSError:
            continue
        if stat.rsplit(")", 1)[-1].split()[:1] in (["Z"], ["X"]):
            continue
        if exe.startswith(own) or "nsight-compute" in exe.lower():
            continue
        found.append(stat[stat.find("(") + 1 : stat.rfind(")")] or name)
    return found


if __name__ == "__main__":
    serve(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 120.0)
