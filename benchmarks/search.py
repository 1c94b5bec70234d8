"""Compare search strategies and descriptor sets at equal evaluation budgets over several seeds.

Every run is a real optimize loop (offline generator, real evaluations on the chosen backend). All
runs share one store, so a kernel proposed by two runs is measured once and both see the same time:
the comparison is about *what* each run finds, not about timing noise. Prints one row per
(descriptors, strategy, seed) and a summary per (descriptors, strategy): best speedup over the
reference and over the naive seed kernel, archive coverage (share of the grid holding a correct elite:
4x4x4 static, 4x4x4x4 measured) and the number of distinct cells those elites fill.

    python benchmarks/search.py                                  # matmul on PoCL, 3 seeds, 24 evaluations
    python benchmarks/search.py --descriptors static,measured --strategies map_elites --seeds 1
    python benchmarks/search.py --problem examples/kernelbench/softmax.py --evaluations 30 --seeds 5
    python benchmarks/search.py --backend cuda --descriptors static,measured --strategies map_elites \\
        --seeds 1 --initial 8                                    # the offline CUDA recipes, on the H200
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kfoundry.core.config import load_config
from kfoundry.core.evaluation import Evaluator
from kfoundry.core.loop import OptimizeLoop, find_seed_kernel, new_run_dir
from kfoundry.core.problem import load_problem, parse_shape_overrides
from kfoundry.core.store import Store

FAST = [
    "evaluation.trials=3",
    "evaluation.target_time_s=0.1",
    "evaluation.warmup_s=0.02",
    "evaluation.min_repeats=5",
]


def run_one(
    problem_path: Path,
    shapes: dict,
    strategy: str,
    seed: int,
    evaluations: int,
    backend: str,
    store: Store,
    out: Path,
    fast: bool,
    initial: int,
    descriptors: str = "static",
    workers: int = 1,
    wall_s: float | None = None,
    profile: str = "auto",
) -> dict:
    overrides = [
        f"search.name={strategy}",
        f"seed={seed}",
        f"budget.evaluations={evaluations}",
        "budget.generations=1000",
        "tuner.every=-1",
        f"backend.name={backend}",
        f"output_dir={out}",
        f"search.options.descriptors={descriptors}",
        f"executor.options.workers={workers}",
        *([f"budget.wall_time_s={wall_s}"] if wall_s else []),
        *([f"search.options.profile={profile}"] if profile != "auto" else []),
    ]
    config = load_config(overrides=overrides + (FAST if fast else []))
    problem = load_problem(problem_path, shapes)
    run_id, run_dir = new_run_dir(config, f"{problem.name}-{strategy}-{descriptors}-s{seed}")
    evaluator = Evaluator(problem, config, store, run_id)
    seed_kernel = find_seed_kernel(problem_path, evaluator.backend.language)
    loop = OptimizeLoop(
        config, problem, evaluator, store, run_id, run_dir, seed_kernel=seed_kernel, initial_proposals=initial
    )
    t0 = time.monotonic()
    summary = loop.run()
    best = summary.best
    cells = {tuple(c.coords) for c in loop.strategy.archive if c.record.is_correct}
    return {
        "descriptors": descriptors,
        "cells": len(cells),
        "axes": ",".join(loop.space.names),
        "strategy": strategy,
        "seed": seed,
        "evaluations": summary.evaluations,
        "speedup": best.record.speedup if best and best.record.is_correct else None,
        "vs_seed": summary.speedup_over_seed,
        "coverage": summary.coverage,
        "ms": best.record.timing.median_ms if best and best.record.timing else None,
        "roofline": best.record.roofline_fraction if best else None,
        "best": best.candidate.label if best else "-",
        "params": best.candidate.params if best else {},
        "wall_s": time.monotonic() - t0,
        "profiled": _profiled(loop),
        "traffic": _traffic_lines(loop),
    }


def _traffic_lines(loop: OptimizeLoop) -> list[str]:
    """One line per distinct cell with measured traffic: the best elite there and what ncu saw."""
    best: dict[tuple[int, ...], object] = {}
    for c in loop.strategy.archive:
        if c.record.is_correct and c.record.descriptors.get("traffic_measured"):
            key = tuple(c.coords)
            if key not in best or c.record.fitness > best[key].record.fitness:  # type: ignore[attr-defined]
                best[key] = c
    lines = []
    for coords, c in sorted(best.items()):
        d = c.record.descriptors  # type: ignore[attr-defined]
        lines.append(
            f"  cell {coords} {c.candidate.label} {c.candidate.params}: {c.record.speedup or 0:.2f}x, "  # type: ignore[attr-defined]
            f"DRAM {d['dram_bytes'] / 1e6:.1f} MB, L2 {d['l2_bytes'] / 1e6:.1f} MB (reuse {d['l2_reuse']:.1f}), "
            f"L1 {d['l1_bytes'] / 1e6:.1f} MB, intensity {d['measured_intensity']:.1f} FLOP/B "
            f"(compiled-code estimate {d.get('static_intensity', 0):.1f}), hierarchy {d['hierarchy']:g} "
            f"(estimate {d.get('static_hierarchy', 0):g}), achieved occupancy {d.get('achieved_occupancy', 0):.2f}"
        )
    return lines


def _profiled(loop: OptimizeLoop) -> str:
    """How many correct records got ncu traffic, and the first reason one did not."""
    if loop.space.profiler is None:
        return "ncu pass off"
    records = [c.record for c in loop.strategy.archive if c.record.is_correct]
    got = sum(1 for r in records if r.descriptors.get("traffic_measured"))
    why = getattr(loop.space, "profile_warning", None)
    return f"ncu traffic {got}/{len(records)} elites" + (f" ({why})" if why and not got else "")


def profile_check(
    problem_path: Path, shapes: dict, backend: str, store: Store, out: Path, console: Console
) -> None:
    """Profile the naive seed kernel once under ncu in the sandbox; print the metrics or why there are none."""
    from kfoundry.core.behaviour.traffic import traffic_features
    from kfoundry.core.evaluation.profile import find_ncu, profile_candidate
    from kfoundry.core.models import Candidate

    config = load_config(overrides=[f"backend.name={backend}", f"output_dir={out}"])
    problem = load_problem(problem_path, shapes)
    evaluator = Evaluator(problem, config, store, "profile-check")
    language = evaluator.backend.language
    seed = find_seed_kernel(problem_path, language)
    if seed is not None:
        candidate = Candidate(source=seed.read_text(), language=language)
    else:  # the offline cookbook's first (naive) recipe
        from kfoundry.plugins.llms.offline.generator import OfflineGenerator

        candidate = OfflineGenerator().recipes(problem.summary(), language)[0].candidate()
    console.print(f"profile check: kernel {candidate.label or seed}")
    job = evaluator._job("evaluate", candidate)
    console.print(f"profile check: ncu = {find_ncu()}")
    result = profile_candidate(job, timeout_s=45)
    if result.warning:
        console.print(f"profile check ({result.wall_s:.1f} s): {result.warning}")
        console.print("ncu's output in the sandbox (tail):\n" + "\n".join(result.detail.splitlines()[-12:]))
        if os.geteuid() == 0 and find_ncu():
            trusted_ncu_check(job, problem, console)
    else:
        feats = traffic_features(result.metrics, float(problem.flops))
        shown = {k: f"{v:.4g}" for k, v in feats.items()}
        console.print(f"profile check ({result.wall_s:.1f} s): {result.launches} launch(es), {shown}")
    sys.stdout.flush()


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "x") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", default="examples/kernelbench/matmul.py")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--strategies", default="map_elites,ga,random_search")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--evaluations", type=int, default=24)
    parser.add_argument("--backend", default="opencl")
    parser.add_argument(
        "--workers", type=int, default=None, help="jobs evaluated at once (default: 4 on cuda, 1 elsewhere)"
    )
    parser.add_argument(
        "--wall-s", type=float, default=None, help="wall-clock cap per run (budget.wall_time_s)"
    )
    parser.add_argument(
        "--profile",
        default="auto",
        choices=["auto", "on", "off"],
        help="the ncu traffic pass of measured runs (search.options.profile)",
    )
    parser.add_argument(
        "--profile-check",
        action="store_true",
        help="first profile the naive seed kernel once in the sandbox under ncu and print what came back",
    )
    parser.add_argument(
        "--descriptors",
        default="static,measured",
        help="comma-separated descriptor sets to compare (static, measured)",
    )
    parser.add_argument(
        "--initial",
        type=int,
        default=1,
        help="generator seeds in generation 0 (1: only the naive recipe, so the search must climb)",
    )
    parser.add_argument(
        "--full-timing", action="store_true", help="use the default (slower) evaluation settings"
    )
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary folder)")
    args = parser.parse_args()

    out = Path(args.out or tempfile.mkdtemp(prefix="kf-bench-search-"))
    store = Store(out / "shared.db")
    shapes = parse_shape_overrides(args.shape)
    console = Console(width=max(Console().width, 180))
    rows = []
    sets = args.descriptors.split(",")
    workers = args.workers or (4 if args.backend == "cuda" else 1)
    if args.profile_check:
        profile_check(Path(args.problem), shapes, args.backend, store, out, console)
    for seed in range(args.seeds):
        for descriptors in sets:
            for strategy in args.strategies.split(","):
                row = run_one(
                    Path(args.problem),
                    shapes,
                    strategy,
                    seed,
                    args.evaluations,
                    args.backend,
                    store,
                    out,
                    not args.full_timing,
                    args.initial,
                    descriptors,
                    workers,
                    args.wall_s,
                    args.profile,
                )
                console.print(
                    f"[dim]{descriptors} {strategy} seed {seed}: best {_fmt(row['speedup'])} "
                    f"({row['best']}), coverage {row['coverage']:.1%} ({row['cells']} cells), "
                    f"{row['wall_s']:.0f} s, {row['profiled']}[/dim]"
                )
                for line in row["traffic"]:
                    console.print(line, markup=False)
                sys.stdout.flush()
                rows.append(row)

    table = Table(
        title=f"search strategies on {Path(args.problem).name} ({args.backend}), "
        f"{args.evaluations} evaluations per run"
    )
    for col in (
        "descriptors",
        "strategy",
        "seed",
        "best kernel",
        "ms",
        "speedup vs reference",
        "vs naive seed",
        "roofline",
        "coverage",
        "cells",
        "evals",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["descriptors"],
            r["strategy"],
            str(r["seed"]),
            f"{r['best']} {r['params']}".replace("[", "\\["),
            _fmt(r["ms"], ".3f", ""),
            _fmt(r["speedup"]),
            _fmt(r["vs_seed"], ".1f"),
            _fmt(None if r["roofline"] is None else 100 * r["roofline"], ".0f", "%"),
            f"{r['coverage']:.1%}",
            str(r["cells"]),
            str(r["evaluations"]),
        )
    console.print(table)

    summary = Table(title=f"per strategy over {args.seeds} seeds (median \\[min-max])")
    for col in ("descriptors", "strategy", "best speedup vs reference", "vs naive seed", "coverage", "cells"):
        summary.add_column(col)
    for descriptors, strategy in ((d, s) for d in sets for s in args.strategies.split(",")):
        mine = [r for r in rows if r["strategy"] == strategy and r["descriptors"] == descriptors]

        def agg(key: str, mine: list[dict] = mine, pct: bool = False) -> str:
            vals = [r[key] for r in mine if r[key] is not None]
            if not vals:
                return "-"
            if pct:
                return f"{statistics.median(vals):.1%} [{min(vals):.1%}-{max(vals):.1%}]"
            return f"{statistics.median(vals):.2f}x [{min(vals):.2f}-{max(vals):.2f}]"

        cells = statistics.median([r["cells"] for r in mine]) if mine else 0
        summary.add_row(
            descriptors, strategy, agg("speedup"), agg("vs_seed"), agg("coverage", pct=True), f"{cells:g}"
        )
    console.print(summary)
    console.print(f"runs and the shared store: {out}")


def trusted_ncu_check(job: object, problem: object, console: Console) -> None:
    """The same ncu command as root and unconfined, on the naive seed kernel (the project's own file,
    never a generated candidate): shows whether the counters work for root and what ncu's CSV looks like."""
    from kfoundry.core.behaviour.traffic import parse_ncu_csv, traffic_features
    from kfoundry.core.evaluation.profile import find_ncu, ncu_command

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "job.json"
        spec.write_text(job.model_dump_json())  # type: ignore[attr-defined]
        log_file = str(Path(tmp) / "ncu.csv")
        target = [sys.executable, "-m", "kfoundry.core.evaluation.profile_target", str(spec)]
        t0 = time.monotonic()
        proc = subprocess.run(
            ncu_command(str(find_ncu()), log_file, target), capture_output=True, text=True, timeout=60
        )
        text = Path(log_file).read_text() if Path(log_file).exists() else ""
        console.print(
            f"trusted ncu check as root, unconfined, seed kernel only: rc {proc.returncode}, "
            f"{time.monotonic() - t0:.1f} s; CSV head:"
        )
        console.print("\n".join(text.splitlines()[:8]) or (proc.stdout + proc.stderr)[-1500:], markup=False)
        try:
            metrics, launches = parse_ncu_csv(text)
            feats = traffic_features(metrics, float(problem.flops))  # type: ignore[attr-defined]
            console.print(f"parsed: {launches} launch(es), " + str({k: f"{v:.4g}" for k, v in feats.items()}))
        except ValueError as exc:
            console.print(f"parse failed: {exc}")


if __name__ == "__main__":
    main()
