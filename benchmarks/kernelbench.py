"""The offline generator over our own KernelBench-format problems (tests/data/kernelbench): one table.

Two phases. The warm-up (``--workers N`` processes, ``kernelbench_warm``) checks every problem's recipes
against eager, one run each, and runs torch.compile once: kernels land in an on-disk compile cache and
torch.compile's graphs in its own caches (Inductor FX graph, autotuning, Triton), all in one temporary
folder. Then the timing, in this process alone on the device, problem by problem: eager, torch.compile
and the recipes the warm-up found correct (``--top N``: the N highest-ranked and the naive one), each
checked against eager again and timed over the same budget (median of CUDA events on the GPU, wall
clock on PoCL), under ``torch.no_grad`` and with TF32 off. A row shows the best recipe's time, its
speed against eager PyTorch, torch.compile and the naive recipe, and its share of the roofline: bytes
over the measured copy bandwidth (``copy``) or FLOPs over the measured fp32 (``fp32``) or fp16 matmul
rate (``fp16``), whichever bound is higher. A problem past ``--problem-s`` (its top recipe is timed all the same) keeps what it measured and
names the rest ``cut``; past ``--deadline-s`` the remaining rows are ``cut``; ``--json`` is rewritten
after every row.

    python benchmarks/kernelbench.py --backend cuda --workers 14   # the H200, problems' own sizes
    python benchmarks/kernelbench.py --backend opencl --small       # PoCL, tests/data small shapes
    python benchmarks/kernelbench.py --backend opencl --small -k conv --level level2
    python benchmarks/kernelbench.py --backend cuda -k conv2d_square --sweep CM,CN   # the top recipe's tiles
    python benchmarks/kernelbench.py --backend cuda --breadth       # correctness only, every problem

``--sweep A,B`` also times the top-ranked recipe that has parameters A and B at every combination of
their values (the row shows the best, named ``recipe[A=..,B=..]``). ``--breadth`` checks correctness
only: the recipes from the highest rank down until the first that matches eager, one run each, no timing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the kernelbench_* modules beside this file

from kernelbench_cache import prepare  # noqa: E402
from kernelbench_run import (  # noqa: E402
    BY_FLOAT64,
    Timer,
    device_usable,
    expected_output,
    float64_truth,
    judge_timer,
    make_timer,
    run_recipe,
    time_ms,
)
from kernelbench_table import HEADER, format_row, notes, summary  # noqa: E402
from kernelbench_warm import COMPILE, Outcome, Task, warm_up  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "kernelbench"
#: A recipe is "slow" (``--slow-s``) only where its warm-up call also took this many times eager's, timed
#: beside it: the warm-up shares the device between its workers, and in session 10 that contention made
#: sgemm_warp's 5 ms call take 13 s (gemm_swish_scaling was then timed with matmul/vector at 0.08x).
SLOW_RATIO = 20.0


def _copy_gbps(device: torch.device, timer: Timer) -> float:
    n = (256 << 20) // 4 if device.type == "cuda" else (16 << 20) // 4
    a = torch.empty(n, device=device)
    b = torch.empty_like(a)
    ms = time_ms(lambda: b.copy_(a), timer, 0.5)
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e9


def _matmul_gflops(device: torch.device, timer: Timer, dtype: torch.dtype) -> float:
    n = 4096 if device.type == "cuda" else 512
    a = torch.rand(n, n, device=device, dtype=dtype)
    ms = time_ms(lambda: a @ a, timer, 0.5)
    return 2 * n**3 / (ms * 1e-3) / 1e9


def _restart(argv: list[str] | None, state: dict[str, Any]) -> None:
    """Continue the run in a fresh process (the rows so far and the warm-up's outcomes in a state file)."""
    fd, name = tempfile.mkstemp(prefix="kernelbench_", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    args = list(sys.argv[1:] if argv is None else argv)
    if "--resume" in args:
        i = args.index("--resume")
        del args[i : i + 2]
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *args, "--resume", name])


def _sweep(
    recipe: Any,
    names: list[str],
    problem: Any,
    inputs: list[Any],
    expected: torch.Tensor,
    device: torch.device,
    timer: Timer,
    budget_s: float,
    load: Any,
) -> dict[str, float]:
    """ms of ``recipe`` at every other combination of its parameters ``names`` that is correct."""
    out: dict[str, float] = {}
    for combo in itertools.product(*(recipe.space.params[n] for n in names)):
        values = dict(zip(names, combo, strict=True))
        if all(recipe.defaults[n] == v for n, v in values.items()):
            continue
        tag = f"{recipe.name}[{','.join(f'{n}={v}' for n, v in values.items())}]"
        variant = dataclasses.replace(recipe, defaults={**recipe.defaults, **values})
        try:
            ms, _ = run_recipe(variant, problem, inputs, expected, device, timer, budget_s, load)
        except Exception as exc:  # noqa: BLE001 - a combination that fails to build loses only itself
            print(f"  # {tag}: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
            continue
        if ms is not None:
            out[tag] = ms
    return out


def _breadth(
    row: dict[str, Any],
    recipes: list[Any],
    problem: Any,
    inputs: list[Any],
    expected: torch.Tensor,
    device: torch.device,
    load: Any,
    truth: Any = None,
) -> bool:
    """Set ``row['recipe']`` to the highest-ranked recipe that matches eager (one run each; ``truth``: the
    float64 fallback of ``close``), and print it; False where a recipe's fault left the device unusable."""
    for recipe in sorted(recipes, key=lambda r: -r.rank):
        try:
            ms, err = run_recipe(recipe, problem, inputs, expected, device, None, 0.0, load, truth)
        except Exception as exc:  # noqa: BLE001 - a recipe that fails to build or launch loses only itself
            row.setdefault("failed", []).append(f"{recipe.name} ({type(exc).__name__}: {str(exc)[:80]})")
            if not device_usable(device):
                row["error"] = f"GPU fault in {recipe.name}"
                print(f"| {row['problem']} | {row['error']}{notes(row)} | | | | | | |", flush=True)
                return False
            continue
        if ms is None:
            row.setdefault("wrong", []).append(f"{recipe.name} (max error {err:.3g})")
            continue
        row["recipe"] = recipe.name
        break
    print(f"| {row['problem']} | {row.get('recipe', 'none correct')}{notes(row)} | | | | | | |", flush=True)
    return True


def _watchdog(args: argparse.Namespace, key: str, state: dict[str, Any]) -> threading.Timer:
    """A started timer that, past ``--row-s``, gives up on the problem ``key``: its row says so and the run
    goes on in a fresh process (a kernel still running cannot be stopped from inside this one)."""

    def abandon() -> None:
        row = {"problem": key, "recognised": True, "error": f"abandoned after --row-s {args.row_s:g} s"}
        print(format_row(row), flush=True)
        rows = [*state["rows"], row]
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
        _restart(args.argv, {**state, "rows": rows})

    timer = threading.Timer(args.row_s, abandon)
    timer.daemon = True
    timer.start()
    return timer


def _line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:240] if str(exc) else ''}"


@dataclasses.dataclass
class Setup:
    """What every problem's measurement needs: the device, its clock, the rates, the options."""

    device: torch.device
    timer: Timer
    rates: dict[str, float]
    args: argparse.Namespace
    load: Any
    #: seconds to the run's deadline and recognised problems still to measure (set before each row)
    left_s: float = math.inf
    left_rows: int = 1


def _pick(
    recipes: list[Any],
    outcome: Outcome | None,
    row: dict[str, Any],
    top: int,
    naive: bool = True,
    slow_s: float = math.inf,
) -> list[Any]:
    """The recipes to time, highest rank first: those the warm-up found correct (every one where it did
    not look), the top ``top`` and the naive one if ``top``; the rest go into the row's notes. A correct
    recipe whose call in the warm-up took over ``slow_s`` is not timed (``slow`` note): its second call's
    seconds (``run_s``, the build left out; the warm-up makes one only where the first call, build
    included, took over a second), and only past ``SLOW_RATIO`` times eager's beside it (``eager_s``);
    nor is the recipe the warm-up was still running, past ``slow_s``, when it was cut (``Outcome.cut_in``)."""
    verdicts = outcome.verdicts if outcome else {}
    keep = []
    for recipe in sorted(recipes, key=lambda r: -r.rank):
        v = verdicts.get(recipe.name)
        took = v.get("run_s", 0.0) if v is not None else 0.0  # none: the first call took under a second
        eager_s = v.get("eager_s", 0.0) if v is not None else 0.0
        if v is not None and v["status"] == "correct" and took > max(slow_s, SLOW_RATIO * eager_s):
            row.setdefault("slow", []).append(f"{recipe.name} ({took:.0f} s a call in the warm-up)")
        elif (
            v is None
            and outcome is not None
            and outcome.cut_in == recipe.name
            and outcome.cut_after_s > slow_s
        ):
            row.setdefault("slow", []).append(
                f"{recipe.name} (still running after {outcome.cut_after_s:.0f} s when the warm-up was cut)"
            )
        elif v is None or v["status"] in ("correct", "unchecked"):
            keep.append(recipe)
        elif v["status"] == "wrong":
            row.setdefault("wrong", []).append(f"{recipe.name} (max error {v.get('err', -1):.3g})")
        else:
            row.setdefault("failed", []).append(f"{recipe.name} ({v.get('detail', '')[:80]})")
    if top and len(keep) > top:
        lowest = min(recipes, key=lambda r: r.rank)
        chosen = keep[:top] + ([lowest] if naive and lowest in keep[top:] else [])
        row["untimed"] = [r.name for r in keep if r not in chosen]
        keep = chosen
    return keep


def _measure(
    key: str, problem: Any, recipes: list[Any], outcome: Outcome | None, s: Setup, state: Any
) -> dict[str, Any]:
    """One problem's row: eager, torch.compile and the recipes timed, the best recipe's ratios."""
    args, device, timer = s.args, s.device, s.timer
    row: dict[str, Any] = {"problem": key, "recognised": True}
    started = time.monotonic()
    a = problem.analysis()
    row["dtypes"] = a.input_dtypes
    torch.manual_seed(0)
    ref = problem.make_reference().to(device)
    inputs = problem.make_inputs(1, device)  # drawn on the device: a host takes seconds at full size
    with torch.no_grad():
        expected, inputs = expected_output(ref, problem, inputs, 1, device)
        eager = time_ms(functools.partial(ref, *inputs), timer, args.budget_s)
    row["eager_ms"] = eager
    truth = float64_truth(ref, inputs)  # only where a recipe misses eager's output by more than 1e-3
    pressed = s.left_s / max(1, s.left_rows) < args.press_s  # behind: the top recipe only, for every row
    if pressed:
        row["pressed"] = True
    todo = _pick(recipes, outcome, row, 1 if pressed else args.top, not pressed, args.slow_s)
    compiled_ms = math.nan
    warm_compile = outcome.verdicts.get(COMPILE) if outcome else None
    if warm_compile is not None and warm_compile["status"] == "wrong":  # timed all the same: the baseline
        row["compile_note"] = f"differs from eager (max error {warm_compile.get('err', -1):.3g})"
    if warm_compile is not None and warm_compile["status"] == "failed":
        row["compile_error"] = warm_compile.get("detail", "")[:100]
    elif not args.no_compile and outcome is not None and COMPILE not in outcome.verdicts and s.left_s < 60:
        row["compile_error"] = "skipped: not warmed, and the deadline is near"
    elif not args.no_compile:
        try:
            torch._dynamo.reset()
            compiled = torch.compile(ref)
            with torch.no_grad():
                first = time.perf_counter()
                compiled(*inputs)  # traced, then Inductor's graph from the warm-up's cache
                row["compile_first_s"] = round(time.perf_counter() - first, 3)
                compiled_ms = time_ms(functools.partial(compiled, *inputs), timer, args.budget_s)
        except Exception as exc:  # noqa: BLE001 - no C++ toolchain on the host, a graph break that fails...
            row["compile_error"] = _line(exc)[:100]
    row["compile_ms"] = compiled_ms
    times: dict[str, float] = {}
    for i, recipe in enumerate(todo):
        if i > 0 and time.monotonic() - started > args.problem_s:  # the top recipe is always timed
            row["cut"] = [r.name for r in todo[i:]]
            break
        try:
            ms, err = run_recipe(
                recipe, problem, inputs, expected, device, timer, args.budget_s, s.load, truth
            )
        except Exception as exc:  # noqa: BLE001 - a recipe that fails to build or launch loses only itself
            row.setdefault("failed", []).append(f"{recipe.name} ({_line(exc)[:80]})")
            if not device_usable(device):  # a fault poisons the context: go on in a new process
                row["error"] = f"GPU fault in {recipe.name}"
                print(format_row(row), flush=True)
                _restart(args.argv, {**state, "rows": [*state["rows"], row]})
            continue
        if ms is None:
            row.setdefault("wrong", []).append(f"{recipe.name} (max error {err:.3g})")
        else:
            times[recipe.name] = ms
            if err == BY_FLOAT64:
                row.setdefault("float64", []).append(recipe.name)
    sweep = [n for n in args.sweep.split(",") if n]
    top = [r for r in recipes if sweep and all(n in r.defaults for n in sweep)]
    if top:
        best_r = max(top, key=lambda r: r.rank)
        times.update(_sweep(best_r, sweep, problem, inputs, expected, device, timer, args.budget_s, s.load))
    if not times:
        if not row.get("cut"):
            row["error"] = f"no recipe was correct{notes(row)}"
        row["s"] = round(time.monotonic() - started, 2)
        return row
    best = min(times, key=lambda n: times[n])
    naive = min(recipes, key=lambda r: r.rank).name
    half = any(str(d).removeprefix("torch.") in ("float16", "bfloat16") for d in a.input_dtypes)
    rate = s.rates["fp16" if half else "fp32"]
    mem_ms, flop_ms = a.bytes_moved / (s.rates["copy"] * 1e9) * 1e3, (a.flops or 0) / (rate * 1e9) * 1e3
    row.update(
        recipe=best,
        ms=times[best],
        x_eager=eager / times[best],
        x_compile=compiled_ms / times[best],
        x_naive=times.get(naive, math.nan) / times[best],
        roofline=max(mem_ms, flop_ms) / times[best],
        roof="copy" if mem_ms >= flop_ms else ("fp16" if half else "fp32"),
        times=times,
    )
    rewrites = [
        d for r in recipes if r.name == best for d in r.description.split("; ") if d.startswith("algebraic")
    ]
    if rewrites:  # fewer operations than the problem as posed: no roofline share, flagged in the table
        row["rewritten"] = rewrites
    row["s"] = round(time.monotonic() - started, 2)
    return row


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "opencl"])
    ap.add_argument("--small", action="store_true", help="use tests/data/kernelbench/small_shapes.json")
    ap.add_argument("--level", action="append", help="level1 / level2 (default both)")
    ap.add_argument("-k", default="", help="only problems whose name contains this (a,b,c: any of them)")
    ap.add_argument("--budget-s", type=float, default=0.3, help="timing budget per measurement")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--json", type=Path, help="also write the rows here (rewritten after every row)")
    ap.add_argument(
        "--sweep", default="", help="A,B: time the top recipe at every value of its parameters A, B"
    )
    ap.add_argument(
        "--breadth", action="store_true", help="correctness only: highest rank down, first correct"
    )
    ap.add_argument(
        "--workers", type=int, default=0, help="warm-up processes (0: no warm-up, compile inline)"
    )
    ap.add_argument(
        "--top", type=int, default=0, help="time only the N highest-ranked correct recipes (+ naive)"
    )
    ap.add_argument(
        "--press-s", type=float, default=1.0, help="below this many s per problem left: top recipe only"
    )
    ap.add_argument(
        "--timer",
        default="events",
        choices=["events", "judge"],
        help="events: CUDA events around each call; judge: the backend's device timer (spin + L2 flush first)",
    )
    ap.add_argument("--problem-s", type=float, default=30.0, help="per problem: later recipes are cut")
    ap.add_argument(
        "--slow-s", type=float, default=30.0, help="a recipe whose warm-up run took longer is not timed"
    )
    ap.add_argument(
        "--row-s", type=float, default=600.0, help="one problem's timing at most: past it the run restarts"
    )
    ap.add_argument("--deadline-s", type=float, default=math.inf, help="whole run: later problems are cut")
    ap.add_argument("--warm-s", type=float, default=240.0, help="the warm-up's own deadline")
    ap.add_argument(
        "--recipe-s", type=float, default=90.0, help="warm-up: one recipe or torch.compile at most"
    )
    ap.add_argument(
        "--mem-gb", type=float, default=0.0, help="warm-up: device memory for tasks (0: 80%% of free)"
    )
    ap.add_argument(
        "--data", type=Path, default=DATA, help="the problems: DATA/level1/*.py, DATA/level2/*.py"
    )
    ap.add_argument("--cache-dir", type=Path, help="compile caches here (default: a new temporary folder)")
    ap.add_argument(
        "--resume", type=Path, help=argparse.SUPPRESS
    )  # state of a run restarted after a GPU fault
    args = ap.parse_args(argv)
    args.argv = argv
    if args.workers < 0 or args.top < 0 or args.budget_s <= 0:
        ap.error("--workers and --top must be >= 0 and --budget-s > 0")
    if not args.data.is_dir():
        ap.error(f"--data {args.data}: not a folder")
    return args


def _problems(
    args: argparse.Namespace, lang: str
) -> list[tuple[str, Any, list[Any] | None, dict[str, Any] | None]]:
    """(key, problem, recipes, row) per selected problem; a problem that fails to load or is not
    recognised comes with its row (an error) and no recipes."""
    from kfoundry.core.problem import load_problem
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator

    shapes = args.data / "small_shapes.json"
    small = json.loads(shapes.read_text()) if args.small and shapes.exists() else {}
    gen = OfflineGenerator()
    out: list[tuple[str, Any, list[Any] | None, dict[str, Any] | None]] = []
    for path in sorted(
        p for lvl in args.level or ["level1", "level2"] for p in (args.data / lvl).glob("*.py")
    ):
        key = f"{path.parent.name}/{path.name}"
        if not any(k in key for k in args.k.split(",")):
            continue
        try:
            problem = load_problem(path, small.get(key, {}))
        except Exception as exc:  # noqa: BLE001 - a broken problem file costs its row
            out.append((key, None, None, {"problem": key, "recognised": False, "error": _line(exc)}))
            continue
        try:
            out.append((key, problem, gen.recipes(problem.summary(), lang), None))
        except Exception as exc:  # noqa: BLE001 - not recognised: one line, the table goes on
            out.append((key, problem, None, {"problem": key, "recognised": False, "error": _line(exc)}))
    return out


def _warm(
    args: argparse.Namespace, todo: list[Any], device: torch.device, folder: Path
) -> dict[str, Outcome]:
    """The parallel warm-up over the recognised problems (their memory estimated from the analysis)."""
    tasks = []
    for key, problem, recipes, _ in todo:
        if recipes is None:
            continue
        try:
            moved = problem.analysis().bytes_moved
        except Exception:  # noqa: BLE001 - the timing phase reports it
            moved = 1 << 30
        tasks.append(Task(key, str(problem.path), dict(problem.shapes), 3 * moved + (256 << 20)))
    if args.mem_gb:
        budget = int(args.mem_gb * 2**30)
    elif device.type == "cuda":
        budget = int(0.8 * torch.cuda.mem_get_info(device)[0]) - args.workers * (600 << 20)
    else:
        budget = int(0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    t0 = time.monotonic()
    outcomes = warm_up(
        tasks,
        backend_name=args.backend,
        folder=folder,
        workers=args.workers,
        mem_budget=budget,
        compile_too=not args.no_compile,
        deadline_s=args.warm_s,
        recipe_s=args.recipe_s,
        log=lambda line: print(line, flush=True),
    )
    verdicts = [v["status"] for o in outcomes.values() for n, v in o.verdicts.items() if n != COMPILE]
    compiled = sum(1 for o in outcomes.values() if o.verdicts.get(COMPILE, {}).get("status") == "correct")
    print(
        f"# warm-up: {len(tasks)} problems in {time.monotonic() - t0:.1f} s with {args.workers} workers "
        f"({budget / 2**30:.0f} GiB for tasks): recipes {verdicts.count('correct')} correct, "
        f"{verdicts.count('wrong')} wrong, {verdicts.count('failed')} failed; torch.compile {compiled} correct; "
        f"{sum(1 for o in outcomes.values() if o.error)} problems with an error",
        flush=True,
    )
    return outcomes


def _timing_note(rows: list[dict[str, Any]], stats: Any) -> str:
    """Where the timing process's seconds went, and whether the warm-up's caches served it."""
    from torch._dynamo.utils import counters

    fx = counters["inductor"]
    first = [r["compile_first_s"] for r in rows if "compile_first_s" in r]
    return (
        f"timing: {sum(r.get('s', 0.0) for r in rows):.1f} s over {len(rows)} rows, of which torch.compile's "
        f"first calls {sum(first):.1f} s (max {max(first, default=0.0):.1f} s); Inductor FX-graph cache "
        f"{fx['fxgraph_cache_hit']} hits, {fx['fxgraph_cache_miss']} misses; kernels from the compile cache "
        f"{stats.hits} loaded, {stats.misses} compiled"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    state: dict[str, Any] = json.loads(args.resume.read_text()) if args.resume else {}
    t0 = state.get("t0", time.time())
    folder = Path(state.get("cache") or args.cache_dir or tempfile.mkdtemp(prefix="kernelbench_cache_"))
    from kfoundry.runtime import load

    backend, device, stats = prepare(args.backend, folder)
    timer = judge_timer(backend) if args.timer == "judge" else make_timer(device)
    if timer is None:
        print(f"kernelbench: --timer judge: backend {args.backend} has no device clock", file=sys.stderr)
        return 2
    lang = "cuda" if args.backend == "cuda" else "opencl"
    todo = _problems(args, lang)
    if "warm" in state:
        outcomes = {k: Outcome(**v) for k, v in state["warm"].items()}
    elif args.workers and not args.breadth:
        outcomes = _warm(args, todo, device, folder)
        if args.json:  # every recipe's warm-up verdict and seconds, beside the rows
            warm = {k: dataclasses.asdict(o) for k, o in outcomes.items()}
            args.json.with_suffix(".warm.json").write_text(json.dumps(warm, indent=1) + "\n")
    else:
        outcomes = {}
    if "rates" in state:
        rates = state["rates"]
    else:  # measured after the warm-up: nothing else on the device
        rates = {"copy": _copy_gbps(device, timer), "fp32": _matmul_gflops(device, timer, torch.float32)}
        half = torch.float16 if device.type == "cuda" else torch.float32
        rates["fp16"] = _matmul_gflops(device, timer, half)
        flags = (
            f"TF32 matmul {torch.backends.cuda.matmul.allow_tf32}, cudnn {torch.backends.cudnn.allow_tf32}"
        )
        print(
            f"# backend {args.backend} ({device}), copy {rates['copy']:.0f} GB/s, fp32 matmul "
            f"{rates['fp32']:.0f} GFLOP/s, fp16 matmul {rates['fp16']:.0f} GFLOP/s; {flags}; budget "
            f"{args.budget_s} s per measurement, timer {args.timer}; timed: "
            + (f"the top {args.top} correct recipes by rank + naive" if args.top else "every correct recipe"),
            flush=True,
        )
        print("\n".join(HEADER), flush=True)
    rows: list[dict[str, Any]] = state.get("rows", [])
    done = {r["problem"] for r in rows}
    setup = Setup(device, timer, rates, args, load)
    run_state = {
        "t0": t0,
        "cache": str(folder),
        "rates": rates,
        "rows": rows,
        "warm": {k: dataclasses.asdict(o) for k, o in outcomes.items()},
    }
    for index, (key, problem, recipes, early) in enumerate(todo):
        if key in done:
            continue
        if early is not None or recipes is None:
            row = early or {"problem": key, "error": "not loaded"}
        elif time.time() - t0 > args.deadline_s:
            row = {"problem": key, "recognised": True, "cut": [f"the run's {args.deadline_s:.0f} s deadline"]}
        elif args.breadth:
            row = {"problem": key, "recognised": True}
            try:
                torch.manual_seed(0)
                ref = problem.make_reference().to(device)
                inputs = problem.make_inputs(1, device)
                with torch.no_grad():
                    expected, inputs = expected_output(ref, problem, inputs, 1, device)
                truth = float64_truth(ref, inputs)
                if not _breadth(row, recipes, problem, inputs, expected, device, load, truth):
                    _restart(argv, {**run_state, "rows": [*rows, row]})
            except Exception as exc:  # noqa: BLE001 - the problem's own fault costs its row
                row["error"] = _line(exc)
                print(format_row(row), flush=True)
            rows.append(row)
            continue
        else:
            outcome = outcomes.get(key)
            setup.left_s = args.deadline_s - (time.time() - t0)
            setup.left_rows = sum(
                1 for k, _, r, e in todo[index:] if r is not None and e is None and k not in done
            )
            print(f"# {time.strftime('%H:%M:%S')} timing {key}", file=sys.stderr, flush=True)
            try:
                if outcome is not None and outcome.fatal:
                    row = {"problem": key, "recognised": True, "error": f"warm-up: {outcome.error}"}
                else:
                    watchdog = _watchdog(args, key, run_state)
                    try:
                        row = _measure(key, problem, recipes, outcome, setup, run_state)
                    finally:
                        watchdog.cancel()
            except Exception as exc:  # noqa: BLE001 - the problem's own fault costs its row
                row = {"problem": key, "recognised": True, "error": _line(exc)}
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(format_row(row), flush=True)
        if args.sweep and "times" in row:  # every time of this problem now (a run cut short keeps them)
            ranked = sorted(row["times"].items(), key=lambda i: i[1])
            print(f"#   {key}: " + ", ".join(f"{n} {t:.4f}" for n, t in ranked), flush=True)
        rows.append(row)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.breadth:
        ok = [r for r in rows if "recipe" in r]
        print(f"\n{len(ok)}/{len(rows)} problems with a correct kernel (correctness only)")
        return 0
    print(f"\n# {time.time() - t0:.1f} s in all; {_timing_note(rows, stats)}")
    print("\n".join(summary(rows, compiled=not args.no_compile)))
    good = [r for r in rows if "ms" in r]
    print("\nms of every timed recipe at its defaults (eager, torch.compile first):")
    for r in good:
        timed = sorted(r["times"].items(), key=lambda i: i[1])
        print(
            f"  {r['problem']}: eager {r['eager_ms']:.4f}, compile {r['compile_ms']:.4f}; "
            + ", ".join(f"{n} {t:.4f}" for n, t in timed)
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
