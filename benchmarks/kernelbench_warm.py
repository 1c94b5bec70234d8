"""The KernelBench table's parallel warm-up: a pool of worker processes checks every problem's recipes
against eager (one run each, no timing) and runs torch.compile once, filling the shared caches
(``kernelbench_cache.prepare``), so that the timing process, alone on the device afterwards, loads
kernels and compiled graphs instead of compiling them.

Each worker reports every recipe's verdict as it goes, so a worker that dies (a segfault) or loses its
CUDA context (an illegal address is sticky) costs only the recipe it was running: the problem goes to
a fresh worker with that recipe marked failed and the ones already checked skipped. Tasks start while
their estimated device memory fits beside the ones in flight (largest first).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

#: the pseudo-recipe name of torch.compile's run in a warm-up result
COMPILE = "torch.compile"
#: how often a task that ran out of device memory beside others is tried again (twice its estimate each time)
OOM_RETRIES = 2


@dataclass
class Task:
    """One problem to warm: its file, shape overrides, the recipes to skip, its memory estimate."""

    key: str
    path: str
    shapes: dict[str, Any]
    mem: int
    skip: list[str] = field(default_factory=list)
    tries: int = 0
    #: times it went back to the queue after running out of device memory beside other tasks
    oom_tries: int = 0


@dataclass
class Outcome:
    """What the warm-up learned of one problem: per recipe (and torch.compile) a verdict."""

    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str = ""
    #: the error is the problem's own (its reference fails, or it took down every worker it met): the
    #: timing process skips it; otherwise (not warmed in time) the timing process compiles it itself
    fatal: bool = False
    seconds: float = 0.0
    #: the recipe the warm-up was still running when its time ran out, and for how long it had run: past
    #: ``--slow-s`` it is not timed (the timing process running it again would spend its row's whole
    #: ``--row-s`` there)
    cut_in: str = ""
    cut_after_s: float = 0.0


def _worker(backend_name: str, folder: str, compile_too: bool, conn: Any) -> None:
    """A worker's loop: set up like the timing process, then one problem per task until None. Messages
    go out on ``conn`` synchronously (a worker that dies has sent everything before its death)."""
    # spawn imported the parent's script again as __mp_main__, and Python 3.11's pickle then names a
    # module-less global (torch.contiguous_format) after it: Inductor's FX-graph cache keys would differ
    # from the timing process's (where __main__ is skipped), so every lookup there would miss
    sys.modules.pop("__mp_main__", None)
    import torch
    from kernelbench_cache import prepare
    from kernelbench_run import (
        BY_FLOAT64,
        close,
        device_usable,
        eager_wall_s,
        expected_output,
        float64_truth,
        run_recipe,
    )

    from kfoundry.core.problem import load_problem
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator
    from kfoundry.runtime import load, synchronize

    _, device, _ = prepare(backend_name, Path(folder))
    gen = OfflineGenerator()
    conn.send(("ready", "", "", {}))

    def set_up(task: Task) -> tuple[Any, Any, list[Any], Any, list[Any]]:
        problem = load_problem(Path(task.path), task.shapes)
        torch.manual_seed(0)
        ref = problem.make_reference().to(device)
        inputs = problem.make_inputs(1, device)
        with torch.no_grad():
            expected, inputs = expected_output(ref, problem, inputs, 1, device)
        recipes = sorted(gen.recipes(problem.summary(), _language(backend_name)), key=lambda r: -r.rank)
        return problem, ref, inputs, expected, recipes

    while (task := conn.recv()) is not None:
        key = task.key
        failed = False
        try:
            problem, ref, inputs, expected, recipes = set_up(task)
        except Exception as exc:  # noqa: BLE001 - the problem's own fault, one line
            # beside other tasks (memory, a context the device would not give): the timing process tries
            crowded = isinstance(exc, torch.cuda.OutOfMemoryError) or device_crowded(exc)
            conn.send(("unwarmed" if crowded else "error", key, "", {"detail": _line(exc)}))
            failed = True
        if failed:  # what the failed set-up held is freed with its frame
            if device.type == "cuda":
                torch.cuda.empty_cache()
            conn.send(("done", key, "", {}))
            continue
        truth = float64_truth(ref, inputs)
        names = [r.name for r in recipes]
        if compile_too:  # after the two highest-ranked recipes (the ones timed), before the slow naive ones
            names.insert(min(2, len(names)), COMPILE)
        for name in (n for n in names if n not in task.skip):
            conn.send(("start", key, name, {}))
            t0 = time.perf_counter()
            try:
                if name == COMPILE:
                    torch._dynamo.reset()
                    with torch.no_grad():
                        got = torch.compile(ref)(*inputs)
                    synchronize()
                    ok, err = close(got, expected)
                    del got
                    ms: float | None = 0.0 if ok else None
                else:
                    recipe = next(r for r in recipes if r.name == name)
                    ms, err = run_recipe(recipe, problem, inputs, expected, device, None, 0.0, load, truth)
                verdict: dict[str, Any] = (
                    {"status": "correct"} if ms is not None else {"status": "wrong", "err": err}
                )
                if ms is not None and err == BY_FLOAT64:
                    verdict["by"] = "float64"
                if ms:  # the first call took over a second: a second call's wall time, the build left out
                    verdict["run_s"] = round(ms / 1e3, 3)
                    if ms > 1e3:  # and eager's beside it, under the same contention (``SLOW_RATIO``)
                        eager_s, inputs = eager_wall_s(ref, problem, inputs, device)
                        verdict["eager_s"] = round(eager_s, 3)
            except (
                torch.cuda.OutOfMemoryError
            ):  # beside the other workers' tasks: the timing process checks it
                verdict = {"status": "unchecked", "detail": "out of memory in the warm-up"}
            except Exception as exc:  # noqa: BLE001 - a recipe that fails to build or launch loses only itself
                verdict = {"status": "failed", "detail": _line(exc)}
            verdict["s"] = round(time.perf_counter() - t0, 3)
            if not device_usable(device):
                verdict = {"status": "failed", "detail": f"GPU fault ({verdict.get('detail', '')})"}
                conn.send(("verdict", key, name, verdict))
                return  # the context is lost: the parent starts a fresh worker
            conn.send(("verdict", key, name, verdict))
        del ref, inputs, expected, truth
        if device.type == "cuda":
            torch.cuda.empty_cache()
        conn.send(("done", key, "", {}))


def _language(backend_name: str) -> str:
    return "cuda" if backend_name == "cuda" else "opencl"


#: what a CUDA call reports when the device is short of something other workers hold, not the problem's
#: fault: no context to be had (another process holds the device, or too many contexts), cuBLAS' handle
#: not allocated, memory (session 16's call 3 lost 27 rows to these in the warm-up)
CROWDED = ("busy or unavailable", "CUBLAS_STATUS_ALLOC_FAILED", "out of memory")


def device_crowded(exc: BaseException) -> bool:
    """Whether ``exc`` says the device was crowded (:data:`CROWDED`) rather than that the problem failed."""
    return any(c in str(exc) for c in CROWDED)


def _line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:120] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


@dataclass
class _Slot:
    proc: Any
    conn: Any
    task: Task | None = None
    task_started: float = 0.0
    recipe_started: float = 0.0
    running: str = ""
    ready: bool = False


def warm_up(
    tasks: list[Task],
    *,
    backend_name: str,
    folder: Path,
    workers: int,
    mem_budget: int,
    compile_too: bool,
    deadline_s: float,
    recipe_s: float,
    log: Any = print,
    worker: Any = None,
) -> dict[str, Outcome]:
    """Warm every task in ``workers`` processes within ``deadline_s`` (a recipe or torch.compile running
    past ``recipe_s`` is cut: marked failed, its worker replaced); the outcome per problem key."""
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    outcomes = {t.key: Outcome() for t in tasks}
    pending = sorted(tasks, key=lambda t: -t.mem)
    slots: list[_Slot] = []
    setup_failures = 0

    def spawn() -> _Slot:
        mine, theirs = ctx.Pipe()
        target = worker or _worker  # (a test's stand-in: a module-level function, for spawn)
        p = ctx.Process(target=target, args=(backend_name, str(folder), compile_too, theirs), daemon=True)
        p.start()
        theirs.close()
        return _Slot(p, mine)

    def replace(slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)
        slot.conn.close()
        slots[slots.index(slot)] = spawn()

    def lose(slot: _Slot, why: str) -> None:
        """The slot's worker is gone: the recipe it ran failed; the rest of its problem goes back."""
        task = slot.task
        if task is not None:
            if slot.running:
                outcomes[task.key].verdicts.setdefault(slot.running, {"status": "failed", "detail": why})
            task.skip = [*outcomes[task.key].verdicts]
            task.tries += 1
            if task.tries < 4:
                pending.insert(0, task)
            else:
                outcomes[task.key].error = f"warm-up gave up after {task.tries} lost workers ({why})"
                outcomes[task.key].fatal = True
        replace(slot)

    def receive(slot: _Slot, kind: str, key: str, name: str, data: dict[str, Any]) -> None:
        if kind == "ready":
            slot.ready = True
        elif slot.task is None or slot.task.key != key:
            return
        elif kind == "start":
            slot.running, slot.recipe_started = name, time.monotonic()
        elif kind == "verdict":
            outcomes[key].verdicts[name] = data
            slot.running = ""
        elif kind in ("error", "unwarmed"):
            outcomes[key].error, outcomes[key].fatal = data["detail"], kind == "error"
        elif kind == "done":
            outcomes[key].seconds += time.monotonic() - slot.task_started
            task, slot.task = slot.task, None
            retry_after_oom(task)

    def retry_after_oom(task: Task) -> None:
        """A task that ran out of device memory beside the others goes back to the queue (at most
        ``OOM_RETRIES`` times) with twice its estimate, the recipes already judged skipped: it starts
        once that much is free (alone, at worst), so a wrong estimate costs time, not the row."""
        out = outcomes[task.key]
        short = [n for n, v in out.verdicts.items() if v.get("status") == "unchecked"]
        if not (short or (out.error and not out.fatal)) or task.oom_tries >= OOM_RETRIES:
            return
        for name in short:
            del out.verdicts[name]
        if out.error and not out.fatal:
            out.error = ""
        task.skip = [*out.verdicts]
        task.oom_tries += 1
        task.mem = min(2 * task.mem, mem_budget)
        pending.append(task)
        pending.sort(key=lambda t: -t.mem)

    def drain(slot: _Slot) -> bool:
        """Read every message the slot's worker has sent; False once its end is closed (it died)."""
        try:
            while slot.conn.poll():
                receive(slot, *slot.conn.recv())
        except (EOFError, OSError):
            return False
        return True

    start = time.monotonic()
    slots.extend(spawn() for _ in range(workers))
    while pending or any(s.task for s in slots):
        now = time.monotonic()
        if now - start > deadline_s or setup_failures >= 3:
            why = (
                f"the warm-up's {deadline_s:.0f} s ran out"
                if setup_failures < 3
                else "workers failed to start"
            )
            for s in slots:
                if s.task is not None:
                    outcomes[s.task.key].error = f"warm-up cut: {why} (in {s.running or 'setup'})"
                    outcomes[s.task.key].cut_in = s.running
                    outcomes[s.task.key].cut_after_s = round(now - s.recipe_started, 3) if s.running else 0.0
                    s.proc.kill()
            for t in pending:
                outcomes[t.key].error = f"not warmed: {why}"
            log(f"# warm-up stopped: {why}; {len(pending)} problems not warmed")
            break
        in_flight = sum(s.task.mem for s in slots if s.task)
        for s in slots:
            if s.task is None and s.ready and pending:
                fits = [t for t in pending if in_flight + t.mem <= mem_budget or in_flight == 0]
                if fits:
                    s.task, s.task_started, s.recipe_started, s.running = fits[0], now, now, ""
                    pending.remove(fits[0])
                    in_flight += fits[0].mem
                    s.conn.send(s.task)
        wait([s.conn for s in slots], timeout=0.2)
        for s in list(slots):
            if not drain(s) or not s.proc.is_alive():
                drain(s)  # what it sent before it died
                s.proc.join(5)
                if s.task is not None:
                    lose(s, f"worker exited ({s.proc.exitcode})")
                else:
                    setup_failures += not s.ready
                    replace(s)
            elif s.task is not None and time.monotonic() - s.recipe_started > recipe_s:
                log(f"# warm-up: {s.task.key} {s.running or 'setup'} ran past {recipe_s:.0f} s: cut")
                lose(s, f"cut after {recipe_s:.0f} s in the warm-up")
    for s in slots:
        if s.proc.is_alive() and s.task is None and s.ready:
            try:
                s.conn.send(None)
            except OSError:
                s.proc.kill()
    for s in slots:
        s.proc.join(10 if s.task is None and s.ready else 0)
        if s.proc.is_alive():
            s.proc.kill()
            s.proc.join(5)
        s.conn.close()
    return outcomes
