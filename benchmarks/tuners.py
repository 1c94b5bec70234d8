"""Replay recorded tuning spaces with every tuner, ours and Kernel Tuner's, and print the comparison.

    python benchmarks/tuners.py                                  # every space in benchmarks/spaces/
    python benchmarks/tuners.py my_cache.json --seeds 20 --jobs 2
    python benchmarks/tuners.py --no-kernel-tuner --tuners bayesian,random

For each space, tuner and budget (20/50/100/200 unique evaluations) over ``--seeds`` seeds: the
median best/optimum, and the median number of evaluations to come within 5% and within 1% of the
optimum (from the runs at the largest budget; ">" when the median run never got there), then the
geometric mean over spaces. The space replayed is the same for everyone: the recorded
configurations that did not fail (Kernel Tuner's own simulation-mode definition).

Our tuners do not depend on the budget (they never look at it), so one run at the largest budget
gives every smaller budget as a prefix. Kernel Tuner's strategies do (``max_fevals`` shapes their
schedules), so each runs once per budget, through ``kernel_tuner.tune_cache`` in simulation mode,
counting unique configurations as evaluations. ``kernel_tuner`` is a benchmark-only dependency
(``pip install -e .[bench]``).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one BLAS thread per worker
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from kfoundry.core.recorded import RecordedSpace, replay_objective  # noqa: E402
from kfoundry.core.tuner import Budget, run_tuner  # noqa: E402

SPACES_DIR = Path(__file__).parent / "spaces"
BUDGETS = (20, 50, 100, 200)
KT_STRATEGIES = (
    "random_sample",
    "genetic_algorithm",
    "pso",
    "bayes_opt",
    "simulated_annealing",
    "basinhopping",
)
#: Our tuners: label -> (plugin name, options).
OURS: dict[str, tuple[str, dict[str, Any]]] = {
    "bayesian": ("bayesian", {}),
    "bayesian[optuna-tpe]": ("bayesian", {"engine": "optuna-tpe"}),
    "bayesian[optuna-gp]": ("bayesian", {"engine": "optuna-gp"}),
    "nevergrad": ("nevergrad", {}),
    "random": ("random", {}),
    "grid": ("grid", {}),
}
DEFAULT_OURS = ("bayesian", "bayesian[optuna-tpe]", "nevergrad", "random", "grid")

_spaces: dict[str, RecordedSpace] = {}


def _space(path: str) -> RecordedSpace:
    if path not in _spaces:
        _spaces[path] = RecordedSpace.load(path)
    return _spaces[path]


def run_ours(path: str, label: str, seed: int, budget: int) -> list[float | None]:
    """Objective values in evaluation order (None: invalid) of one of our tuners on one space."""
    from kfoundry.core.plugins import get_plugin

    recorded = _space(path)
    name, options = OURS[label]
    tuner = get_plugin("tuner", name).build(options)
    trace = run_tuner(
        recorded.space(), replay_objective(recorded), tuner, Budget(evaluations=budget), seed=seed
    )
    return [t.value for t in trace.trials]


def run_kernel_tuner(path: str, strategy: str, seed: int, budget: int) -> list[float | None]:
    """Objective values of the unique configurations, in order, of one Kernel Tuner strategy run."""
    from kernel_tuner.interface import tune_cache

    recorded = _space(path)
    np.random.seed(seed)
    random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = tune_cache(
            path, strategy=strategy, strategy_options={"max_fevals": budget}, quiet=True, verbose=False
        )
    seen: set[tuple[Any, ...]] = set()
    values: list[float | None] = []
    for result in results:
        if not result:
            continue
        key = tuple(result[k] for k in recorded.keys_order)
        if key in seen:
            continue
        seen.add(key)
        values.append(recorded.values.get(key))
    return values[:budget]


def _task(args: tuple[str, str, str, int, int]) -> tuple[str, str, int, int, list[float | None], float]:
    kind, path, method, seed, budget = args
    start = time.perf_counter()
    fn = run_ours if kind == "ours" else run_kernel_tuner
    values = fn(path, method, seed, budget)
    return path, method, budget, seed, values, time.perf_counter() - start


def best_ratio(values: Sequence[float | None], budget: int, optimum: float) -> float:
    valid = [v for v in values[:budget] if v is not None]
    return min(valid) / optimum if valid else math.inf


def evals_to(values: Sequence[float | None], target: float) -> float:
    for i, v in enumerate(values, 1):
        if v is not None and v <= target:
            return float(i)
    return math.inf


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if all(math.isfinite(x) for x in xs) else math.inf


def _fmt_ratio(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else "-"


def _fmt_evals(x: float, cap: int) -> str:
    return f"{x:.0f}" if math.isfinite(x) and x <= cap else f">{cap}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "spaces", nargs="*", help="Kernel Tuner cache files (default: benchmarks/spaces/*.json)"
    )
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tuners", default=",".join(DEFAULT_OURS), help=f"ours, of: {', '.join(OURS)}")
    parser.add_argument("--strategies", default=",".join(KT_STRATEGIES), help="Kernel Tuner strategies")
    parser.add_argument("--no-kernel-tuner", action="store_true")
    args = parser.parse_args(argv)
    paths = [str(p) for p in (args.spaces or sorted(SPACES_DIR.glob("*.json")))]
    if not paths:
        sys.exit("no recorded spaces given or found in benchmarks/spaces/")
    ours = [t for t in args.tuners.split(",") if t]
    for label in ours:
        if label not in OURS:
            sys.exit(f"unknown tuner {label!r} (known: {', '.join(OURS)})")
    strategies = [] if args.no_kernel_tuner else [s for s in args.strategies.split(",") if s]
    top = max(BUDGETS)
    for path in paths:
        rec = _space(path)
        print(
            f"{rec.describe()}; share within 5%: {rec.fraction_within(1.05):.2%}, within 1%: "
            f"{rec.fraction_within(1.01):.2%}"
        )
    tasks = [("ours", p, m, s, top) for p in paths for m in ours for s in range(args.seeds)]
    tasks += [
        ("kt", p, m, s, b) for p in paths for m in strategies for b in BUDGETS for s in range(args.seeds)
    ]
    runs: dict[tuple[str, str, int], list[list[float | None]]] = {}
    cpu: dict[str, float] = {}
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for path, method, budget, _seed, values, secs in pool.map(_task, tasks, chunksize=1):
            runs.setdefault((path, method, budget), []).append(values)
            cpu[method] = cpu.get(method, 0.0) + secs
    print(
        f"\n{len(tasks)} runs in {time.perf_counter() - start:.0f} s ({args.seeds} seeds per tuner, space and budget)"
    )
    methods = [(m, "ours") for m in ours] + [(f"kt:{m}", m) for m in strategies]

    def stats(path: str, label: str) -> tuple[list[float], float, float]:
        rec = _space(path)
        if label.startswith("kt:"):
            name = label[3:]
            ratios = [
                statistics.median(best_ratio(v, b, rec.optimum) for v in runs[(path, name, b)])
                for b in BUDGETS
            ]
            longest = runs[(path, name, top)]
        else:
            longest = runs[(path, label, top)]
            ratios = [statistics.median(best_ratio(v, b, rec.optimum) for v in longest) for b in BUDGETS]
        e5 = statistics.median(evals_to(v, rec.optimum * 1.05) for v in longest)
        e1 = statistics.median(evals_to(v, rec.optimum * 1.01) for v in longest)
        return ratios, e5, e1

    header = ["tuner"] + [f"best/opt@{b}" for b in BUDGETS] + ["evals->5%", "evals->1%"]
    table: dict[str, list[tuple[list[float], float, float]]] = {label: [] for label, _ in methods}
    for path in paths:
        print(f"\n== {_space(path).name} ==")
        print(" | ".join(f"{h:>20}" if i == 0 else f"{h:>12}" for i, h in enumerate(header)))
        for label, _ in methods:
            ratios, e5, e1 = stats(path, label)
            table[label].append((ratios, e5, e1))
            cells = [_fmt_ratio(r) for r in ratios] + [_fmt_evals(e5, top), _fmt_evals(e1, top)]
            print(f"{label:>20} | " + " | ".join(f"{c:>12}" for c in cells))
    print(f"\n== geometric mean over {len(paths)} spaces (evals: not reached counts as {top + 1}) ==")
    print(" | ".join(f"{h:>20}" if i == 0 else f"{h:>12}" for i, h in enumerate(header)))
    for label, _ in methods:
        rows = table[label]
        ratios = [geomean([r[0][i] for r in rows]) for i in range(len(BUDGETS))]
        e5 = geomean([min(r[1], top + 1) for r in rows])
        e1 = geomean([min(r[2], top + 1) for r in rows])
        cells = [_fmt_ratio(r) for r in ratios] + [f"{e5:.1f}", f"{e1:.1f}"]
        print(f"{label:>20} | " + " | ".join(f"{c:>12}" for c in cells))
    print(
        "\nCPU seconds per tuner (all spaces and seeds): " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())
    )


if __name__ == "__main__":
    main()
