"""The offline generator over our own KernelBench-format problems (tests/data/kernelbench), one process.

For each problem: the recipes of the offline generator for the backend's language, each checked against
the eager reference and timed (median of CUDA events on the GPU, wall clock on PoCL); the table shows the
best correct recipe's time, its speed against eager PyTorch and torch.compile, its speedup over the naive
recipe, and its share of the roofline (bytes over measured copy bandwidth or FLOPs over the fp32 peak).

    python benchmarks/kernelbench.py --backend cuda                 # the H200, problems' own sizes
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
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "kernelbench"


def _timer(device: torch.device) -> Callable[[Callable[[], Any], int], float]:
    def gpu(fn: Callable[[], Any], repeats: int) -> float:
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def host(fn: Callable[[], Any], repeats: int) -> float:
        from kfoundry.runtime import synchronize

        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return gpu if device.type == "cuda" else host


def _time(fn: Callable[[], Any], timer: Callable[[Callable[[], Any], int], float], budget_s: float) -> float:
    fn()  # compile / warm up
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    repeats = int(min(200, max(3, budget_s / one)))
    return timer(fn, repeats)


def _copy_gbps(device: torch.device, timer: Callable[[Callable[[], Any], int], float]) -> float:
    n = (256 << 20) // 4 if device.type == "cuda" else (16 << 20) // 4
    a = torch.empty(n, device=device)
    b = torch.empty_like(a)
    ms = _time(lambda: b.copy_(a), timer, 0.5)
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e9


def _fp32_gflops(device: torch.device, timer: Callable[[Callable[[], Any], int], float]) -> float:
    torch.backends.cuda.matmul.allow_tf32 = False
    n = 4096 if device.type == "cuda" else 512
    a = torch.rand(n, n, device=device)
    ms = _time(lambda: a @ a, timer, 0.5)
    return 2 * n**3 / (ms * 1e-3) / 1e9


def _device_usable(device: torch.device) -> bool:
    """False once the CUDA context is lost (an illegal address or a launch failure is sticky)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device=device).add_(1).item()
    except Exception:
        return False
    return True


def _restart(argv: list[str] | None, rows: list[dict[str, Any]], bw: float, peak: float) -> None:
    """Continue the run in a fresh process (the rows so far kept in a state file)."""
    import os
    import tempfile

    fd, name = tempfile.mkstemp(prefix="kernelbench_", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"rows": rows, "bw": bw, "peak": peak}, f)
    args = [a for a in (sys.argv[1:] if argv is None else argv)]
    if "--resume" in args:
        i = args.index("--resume")
        del args[i : i + 2]
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *args, "--resume", name])


def _notes(row: dict[str, Any]) -> str:
    """The recipes that were wrong or failed, for the table's recipe column."""
    parts = [f"{k}: " + ", ".join(row[k]) for k in ("wrong", "failed") if k in row]
    return f" ({'; '.join(parts)})" if parts else ""


def _run_recipe(
    recipe: Any,
    problem: Any,
    inputs: list[Any],
    expected: torch.Tensor,
    device: torch.device,
    timer: Callable[[Callable[[], Any], int], float],
    budget_s: float,
    load: Any,
    timed: bool = True,
) -> tuple[float | None, float]:
    """(median ms, 0) of ``recipe`` at its defaults if it matches the eager output, else (None, max error);
    not ``timed``: (0, 0) where it matches."""
    from kfoundry.runtime import synchronize

    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs()).to(device)
    with torch.no_grad():
        got = model(*inputs)
        synchronize()  # launches are asynchronous
        ok = got.shape == expected.shape and torch.allclose(
            got.float(), expected.float(), rtol=1e-3, atol=1e-3, equal_nan=True
        )
        if not ok:
            err = (got.float() - expected.float()).abs().max().item() if got.shape == expected.shape else -1.0
            return None, err
        if not timed:
            return 0.0, 0.0
        return _time(functools.partial(model, *inputs), timer, budget_s), 0.0


def _sweep(
    recipe: Any,
    names: list[str],
    problem: Any,
    inputs: list[Any],
    expected: torch.Tensor,
    device: torch.device,
    timer: Callable[[Callable[[], Any], int], float],
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
            ms, _ = _run_recipe(variant, problem, inputs, expected, device, timer, budget_s, load)
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
    timer: Callable[[Callable[[], Any], int], float],
    load: Any,
) -> bool:
    """Set ``row['recipe']`` to the highest-ranked recipe that matches eager (one run each), and print it;
    False where a recipe's fault left the device unusable."""
    for recipe in sorted(recipes, key=lambda r: -r.rank):
        try:
            ms, err = _run_recipe(recipe, problem, inputs, expected, device, timer, 0.0, load, timed=False)
        except Exception as exc:  # noqa: BLE001 - a recipe that fails to build or launch loses only itself
            row.setdefault("failed", []).append(f"{recipe.name} ({type(exc).__name__}: {str(exc)[:80]})")
            if not _device_usable(device):
                row["error"] = f"GPU fault in {recipe.name}"
                print(f"| {row['problem']} | {row['error']}{_notes(row)} | | | | | |", flush=True)
                return False
            continue
        if ms is None:
            row.setdefault("wrong", []).append(f"{recipe.name} (max error {err:.3g})")
            continue
        row["recipe"] = recipe.name
        break
    print(f"| {row['problem']} | {row.get('recipe', 'none correct')}{_notes(row)} | | | | | |", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "opencl"])
    ap.add_argument("--small", action="store_true", help="use tests/data/kernelbench/small_shapes.json")
    ap.add_argument("--level", action="append", help="level1 / level2 (default both)")
    ap.add_argument("-k", default="", help="only problems whose name contains this (a,b,c: any of them)")
    ap.add_argument("--budget-s", type=float, default=0.3, help="timing budget per measurement")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument(
        "--sweep", default="", help="A,B: time the top recipe at every value of its parameters A, B"
    )
    ap.add_argument(
        "--breadth", action="store_true", help="correctness only: highest rank down, first correct"
    )
    ap.add_argument(
        "--resume", type=Path, help=argparse.SUPPRESS
    )  # state of a run restarted after a GPU fault
    args = ap.parse_args(argv)
    state = json.loads(args.resume.read_text()) if args.resume else None

    from kfoundry.core.plugins import get_plugin
    from kfoundry.core.problem import load_problem
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator
    from kfoundry.runtime import load, set_backend

    backend = get_plugin("backend", args.backend).build({})
    backend.require_device()
    set_backend(backend)
    device = torch.device(backend.torch_device)
    timer = _timer(device)
    if state is None:
        bw, peak = _copy_gbps(device, timer), _fp32_gflops(device, timer)
        print(f"# backend {args.backend} ({device}), copy {bw:.0f} GB/s, fp32 matmul {peak:.0f} GFLOP/s")
        print("| problem | recipe | ms | x eager | x torch.compile | x naive | roofline share |")
        print("|---|---|---|---|---|---|---|")
    else:
        bw, peak = state["bw"], state["peak"]
    lang = "cuda" if args.backend == "cuda" else "opencl"
    small = json.loads((DATA / "small_shapes.json").read_text()) if args.small else {}
    rows: list[dict[str, Any]] = state["rows"] if state else []
    done = {r["problem"] for r in rows}
    levels = args.level or ["level1", "level2"]
    gen = OfflineGenerator()
    for path in sorted(p for lvl in levels for p in (DATA / lvl).glob("*.py")):
        key = f"{path.parent.name}/{path.name}"
        if not any(k in key for k in args.k.split(",")) or key in done:
            continue
        row: dict[str, Any] = {"problem": key}
        try:
            problem = load_problem(path, small.get(key, {}))
            torch.manual_seed(0)
            ref = problem.make_reference().to(device)
            inputs = problem.make_inputs(1, device)  # drawn on the device: a host takes seconds at full size
            with torch.no_grad():
                expected = ref(*inputs)
            recipes = gen.recipes(problem.summary(), lang)
            if args.breadth:
                if not _breadth(row, recipes, problem, inputs, expected, device, timer, load):
                    _restart(argv, [*rows, row], bw, peak)
                rows.append(row)
                continue
            eager = _time(functools.partial(ref, *inputs), timer, args.budget_s)
            compiled_ms = math.nan
            if not args.no_compile:
                try:
                    compiled = torch.compile(ref)
                    compiled_ms = _time(functools.partial(compiled, *inputs), timer, args.budget_s)
                except Exception as exc:  # no C++ toolchain on the host, a graph break that fails...
                    row["compile_error"] = f"{type(exc).__name__}: {str(exc)[:80]}"
            times: dict[str, float] = {}
            for recipe in recipes:
                try:
                    ms, err = _run_recipe(
                        recipe, problem, inputs, expected, device, timer, args.budget_s, load
                    )
                except Exception as exc:  # a recipe that fails to build or launch loses only itself
                    row.setdefault("failed", []).append(
                        f"{recipe.name} ({type(exc).__name__}: {str(exc)[:80]})"
                    )
                    if not _device_usable(device):  # a fault poisons the context: go on in a new process
                        row["error"] = f"GPU fault in {recipe.name}"
                        print(f"| {key} | {row['error']}{_notes(row)} | | | | | |", flush=True)
                        _restart(argv, [*rows, row], bw, peak)
                    continue
                if ms is None:
                    row.setdefault("wrong", []).append(f"{recipe.name} (max error {err:.3g})")
                else:
                    times[recipe.name] = ms
            sweep = [n for n in args.sweep.split(",") if n]
            top = [r for r in recipes if sweep and all(n in r.defaults for n in sweep)]
            if top:
                best_r = max(top, key=lambda r: r.rank)
                times.update(
                    _sweep(best_r, sweep, problem, inputs, expected, device, timer, args.budget_s, load)
                )
            if not times:
                raise RuntimeError(f"no recipe was correct{_notes(row)}")
            best = min(times, key=lambda n: times[n])
            naive = min(recipes, key=lambda r: r.rank).name
            a = problem.analysis()
            roof_ms = max(a.bytes_moved / (bw * 1e9), (a.flops or 0) / (peak * 1e9)) * 1e3
            row.update(
                recipe=best,
                ms=times[best],
                x_eager=eager / times[best],
                x_compile=compiled_ms / times[best],
                x_naive=times.get(naive, math.nan) / times[best],
                roofline=roof_ms / times[best],
                times=times,
            )
            print(
                f"| {key} | {best}{_notes(row)} | {row['ms']:.4f} | {row['x_eager']:.2f} | {row['x_compile']:.2f} | "
                f"{row['x_naive']:.2f} | {100 * row['roofline']:.0f}% |",
                flush=True,
            )
            if sweep:  # every time of this problem now (a run cut short keeps them)
                ranked = sorted(times.items(), key=lambda i: i[1])
                print(f"#   {key}: " + ", ".join(f"{n} {t:.4f}" for n, t in ranked), flush=True)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            print(f"| {key} | {row['error']} | | | | | |", flush=True)
        rows.append(row)
    if args.breadth:
        ok = [r for r in rows if "recipe" in r]
        print(f"\n{len(ok)}/{len(rows)} problems with a correct kernel (correctness only)")
        return 0
    good = [r for r in rows if "ms" in r]
    if good:
        geo = lambda k: math.exp(statistics.fmean(math.log(r[k]) for r in good if r[k] == r[k] and r[k] > 0))  # noqa: E731
        comp = [r for r in good if r["x_compile"] == r["x_compile"]]
        print(
            f"\n{len(good)}/{len(rows)} problems with a correct kernel; geo-mean x eager {geo('x_eager'):.2f}, "
            f"x torch.compile {geo('x_compile') if comp else math.nan:.2f}, x naive {geo('x_naive'):.2f}"
        )
    print("\nms of every correct recipe at its defaults:")
    for r in good:
        print(
            f"  {r['problem']}: "
            + ", ".join(f"{n} {t:.4f}" for n, t in sorted(r["times"].items(), key=lambda i: i[1]))
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
