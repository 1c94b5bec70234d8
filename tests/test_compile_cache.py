"""The compile service and its cache: kernels compiled in a confined step, artefacts keyed by the
trusted hash of the compile's inputs, served to later jobs, never writable by a candidate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from eval_helpers import BAD, EXAMPLES, fast_config

from kfoundry.core.backend import CompileFailed
from kfoundry.core.evaluation import EvalJob
from kfoundry.core.evaluation.compile_cache import Artifact, CompileCache, compile_key
from kfoundry.core.evaluation.compile_service import compile_confined
from kfoundry.core.models import Candidate, Outcome
from kfoundry.plugins.executors.local import LocalExecutor

needs_pyopencl = pytest.mark.skipif(
    __import__("importlib").util.find_spec("pyopencl") is None,
    reason="pyopencl is not installed (the jobs run on PoCL)",
)

PROBLEM = str(EXAMPLES / "kernelbench" / "vector_add.py")
HONEST = (EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py").read_text()


def _job(source: str, cache: Path | None, **evaluation: Any) -> EvalJob:
    return EvalJob(
        problem_path=PROBLEM,
        shapes={"N": 256},
        candidate=Candidate(source=source),
        evaluation=fast_config(trials=1, **evaluation).evaluation,
        backend_plugin="opencl",
        compile_cache_dir=str(cache) if cache else None,
    )


def test_key_covers_every_input_and_the_cache_checks_its_entries(tmp_path: Path) -> None:
    base: list[Any] = ["opencl", "src", {"B": 64}, ["-O2"], {"fast_math": False}, "pocl 6", "cpu dev"]
    key = compile_key(*base)
    for i, other in enumerate(["cuda", "src ", {"B": 64.0}, ["-O3"], {"fast_math": True}, "pocl 7", "gpu"]):
        changed = list(base)
        changed[i] = other
        assert compile_key(*changed) != key, i
    cache = CompileCache(tmp_path, max_bytes=250)
    cache.put(key, Artifact(b"x" * 100, {"log": "ok"}))
    got = cache.get(key)
    assert got is not None and got.data == b"x" * 100 and got.meta["log"] == "ok"
    (tmp_path / f"{key}.bin").write_bytes(b"y" * 100)  # an entry that does not match its hash is not served
    assert cache.get(key) is None
    for n in range(4):  # bounded: the oldest entries go
        cache.put(compile_key(*[*base[:-1], f"t{n}"]), Artifact(bytes(100), {}))
    assert cache.size() <= 250
    with pytest.raises(ValueError):
        cache.get("../../etc/passwd")


@needs_pyopencl
def test_jobs_share_artefacts_and_compile_errors_keep_their_log(tmp_path: Path) -> None:
    cache = tmp_path / "compile-cache"
    first, second = LocalExecutor().run([_job(HONEST, cache), _job(HONEST, cache)])
    assert first.outcome is second.outcome is Outcome.correct, (first.message, second.message)
    assert [c["cached"] for c in first.compiles] == [False] and first.compiles[0]["kernels"] == ["vector_add"]
    assert [c["cached"] for c in second.compiles] == [True] and "from the cache" in second.log
    bad = LocalExecutor().run([_job((BAD / "compile_error.py").read_text(), cache)])[0]
    assert bad.outcome is Outcome.compile_error and "error" in bad.log.lower(), bad.message
    assert len(list(cache.glob("*.bin"))) == 1  # a failed compile stores nothing
    off = LocalExecutor().run([_job(HONEST, cache, compile_cache=False)])[0]
    assert off.outcome is Outcome.correct and off.compiles == []  # the runner compiled itself


WRONG_SRC = HONEST.replace("c[i] = a[i] + b[i]", "c[i] = a[i] - b[i]")

#: Candidate A: before building its own (wrong) kernel it speaks the wire itself, asking the judge to
#: compile B's source while claiming an artefact and key of its own, tampers with the artefact it
#: gets back, and tries to write into the cache folder.
ATTACKER = """
import json, os, socket, stat, struct
import torch
import torch.nn as nn
from kfoundry.runtime import cdiv, load

B_SRC = {b_src!r}
A_SRC = {a_src!r}
CACHE = {cache!r}


def _channel():
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                return socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            pass


def _attack():
    sock = _channel()
    forged = {{"op": "compile", "source": B_SRC, "defines": {{}}, "build_options": None,
              "artifact": "Zm9yZ2Vk", "key": "0" * 64, "cached": True, "kernels": ["vector_add"]}}
    data = json.dumps(forged).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)
    head, fds, _, _ = socket.recv_fds(sock, 4, 4)
    body = b""
    (size,) = struct.unpack("!I", head)
    while len(body) < size:
        body += sock.recv(size - len(body))
    print("attack: judge answered", body[:80])
    for fd in fds:
        try:
            os.pwrite(fd, b"forged artefact" * 64, 0)
            print("attack: tampered")
        except OSError as exc:
            print("attack: tamper refused", exc.errno)
    try:
        with open(os.path.join(CACHE, "x.bin"), "wb") as handle:
            handle.write(b"forged")
        print("attack: wrote the cache")
    except OSError as exc:
        print("attack: cache not reachable", exc.errno)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        _attack()
        self.k = load(A_SRC, defines=PARAMS)

    def forward(self, a, b):
        c = torch.empty_like(a)
        n = a.numel()
        self.k.vector_add(a, b, c, n, grid=(cdiv(n, 256),), block=(256,))
        return c
"""


def _src(candidate: str) -> str:
    return candidate.split('SRC = r"""', 1)[1].split('"""', 1)[0]


@needs_pyopencl
def test_a_candidate_cannot_poison_another_candidates_key(tmp_path: Path) -> None:
    cache = tmp_path / "compile-cache"
    attacker = ATTACKER.format(b_src=_src(HONEST), a_src=_src(WRONG_SRC), cache=str(cache))
    a = LocalExecutor().run([_job(attacker, cache)])[0]
    assert a.outcome is not Outcome.correct  # its own kernel subtracts
    assert "attack: judge answered" in a.log and "attack: tampered" not in a.log, a.log[-2000:]
    assert "attack: wrote the cache" not in a.log and not (cache / "x.bin").exists()
    # what the judge stored for B's inputs is its own compile of B's real source
    b_key = a.compiles[0]["key"]  # A asked for B's source first (once per shape set it builds)
    assert a.compiles[0]["cached"] is False and any(c["key"] != b_key for c in a.compiles)
    b = LocalExecutor().run([_job(HONEST, cache)])[0]
    assert b.outcome is Outcome.correct, b.message
    assert b.compiles[0] == {**b.compiles[0], "key": b_key, "cached": True}  # B's own program, served


@pytest.mark.skipif(
    shutil.which("nvcc") is None and __import__("importlib").util.find_spec("cuda") is None,
    reason="no CUDA compiler",
)
def test_cuda_compiles_to_a_cubin_without_a_gpu_in_the_confined_step() -> None:
    job = EvalJob(problem_path=PROBLEM, backend="cuda", backend_plugin="cuda", on_gpu=True)
    source = (
        'extern "C" __global__ void scale(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= K; }'
    )
    artifact = compile_confined(job, {"source": source, "defines": {"K": 2.0}}, "9.0", 60.0)
    assert artifact.data[:4] == b"\x7fELF" and artifact.meta["arch"] == "sm_90"
    assert artifact.meta["kernels"] == ["scale"] and json.dumps(artifact.meta)
    with pytest.raises(CompileFailed) as failed:
        compile_confined(job, {"source": source.replace("*=", "*=="), "defines": {"K": 2}}, "9.0", 60.0)
    assert "error" in failed.value.log.lower()


@pytest.mark.skipif(
    shutil.which("nvcc") is None and __import__("importlib").util.find_spec("cuda") is None,
    reason="no CUDA compiler",
)
def test_a_cache_miss_gives_the_lane_up_except_in_timing(tmp_path: Path) -> None:
    import fcntl

    from kfoundry.core.evaluation.compile_lane import DeviceLane
    from kfoundry.core.evaluation.compile_service import CompileService

    job = EvalJob(problem_path=PROBLEM, backend="cuda", backend_plugin="cuda", on_gpu=True)
    lane_path = str(tmp_path / "lane.lock")
    seen_free: list[bool] = []
    real = compile_confined

    def watched(*args: Any) -> Any:  # is the lane free while the judge compiles?
        with open(lane_path, "a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(other, fcntl.LOCK_UN)
                seen_free.append(True)
            except BlockingIOError:
                seen_free.append(False)
        return real(*args)

    source = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= K; }'
    with DeviceLane(lane_path) as lane, pytest.MonkeyPatch.context() as patch:
        patch.setattr("kfoundry.core.evaluation.compile_service.compile_confined", watched)
        service = CompileService(
            job, "toolchain", "9.0", CompileCache(tmp_path / "cache", 1 << 24), lane=lane
        )
        answer, fds = service.handle({"source": source, "defines": {"K": 2.0}})
        assert answer["ok"] is True and fds
        lane.releasable = False  # timing
        answer, more = service.handle({"source": source, "defines": {"K": 3.0}})
        cached, last = service.handle({"source": source, "defines": {"K": 2.0}})
        for fd in fds + more + last:
            __import__("os").close(fd)
    assert seen_free == [True, False]  # released for the first compile, kept for the timing one
    first, second, third = service.records
    assert first["lane_released_s"] > 0 and not first["cached"]
    assert second.get("in_lane") is True and "lane_released_s" not in second
    assert cached["cached"] is True and third["cached"] and len(lane.released) == 1


#: The honest kernel built inside ``forward``, one program per input size (as the offline recipes do).
LAZY = (
    HONEST.replace("        self.k = load(SRC, defines=PARAMS)\n", "        self.k = {}\n")
    .replace(
        "        c = torch.empty_like(a)\n",
        "        if a.numel() not in self.k:\n"
        "            self.k[a.numel()] = load(SRC, defines={**PARAMS, 'N_AT': a.numel()})\n"
        "        c = torch.empty_like(a)\n",
    )
    .replace("self.k.vector_add(", "self.k[a.numel()].vector_add(")
)


@needs_pyopencl
def test_a_compile_job_ships_the_artefacts_its_benchmark_job_serves() -> None:
    job = _job(LAZY, None, shape_variants=1)  # no cache folder: only the shipped artefacts can serve
    compiled = LocalExecutor().run([job.model_copy(update={"kind": "compile"})])[0]
    assert compiled.outcome is Outcome.correct, compiled.message
    # the loads inside forward were asked for (one per shape set) though no kernel ran
    assert len(compiled.artifacts) == len(compiled.compiles) == 2, compiled.compiles
    assert "kernels do not run" in compiled.log and compiled.timing is None
    bench = LocalExecutor().run([job.model_copy(update={"seed_artifacts": compiled.artifacts})])[0]
    assert bench.outcome is Outcome.correct, bench.message
    assert [c.get("seeded") for c in bench.compiles] == [True, True], bench.compiles
    assert {c["key"] for c in bench.compiles} == {k[:16] for k in compiled.artifacts}


@pytest.mark.skipif(
    shutil.which("nvcc") is None and __import__("importlib").util.find_spec("cuda") is None,
    reason="no CUDA compiler",
)
def test_a_cuda_compile_job_needs_no_gpu() -> None:
    import base64

    from kfoundry.core.evaluation.compile_step import unpack
    from kfoundry.core.models import DeviceProfile

    h200 = DeviceProfile(backend="cuda", name="NVIDIA H200", index=0, compute_capability="9.0")
    job = EvalJob(
        kind="compile",
        problem_path=str(EXAMPLES / "kernelbench" / "softmax.py"),
        shapes={"batch_size": 8, "dim": 520},
        # the example builds its program inside forward (its cluster size from the row length)
        candidate=Candidate(
            source=(EXAMPLES / "kernelbench" / "cuda" / "softmax_cuda.py").read_text(), language="cuda"
        ),
        evaluation=fast_config(trials=1, shape_variants=0).evaluation,
        backend="cuda",
        backend_plugin="cuda",
        on_gpu=True,
        device_profile=h200,
    )
    result = LocalExecutor().run([job])[0]
    assert result.outcome is Outcome.correct and len(result.artifacts) == 1, (result.message, result.log)
    artifact = unpack(base64.b64decode(next(iter(result.artifacts.values()))))
    assert artifact.data[:4] == b"\x7fELF" and artifact.meta["arch"] == "sm_90"
    assert "softmax_cluster" in artifact.meta["kernels"]
