"""What warm starting the tuner from the performance database saves, on recorded tuning spaces.

    python benchmarks/warm_start.py                      # every scenario whose spaces are recorded
    python benchmarks/warm_start.py --seeds 10 --tuners random,bayesian --budget 60

The spaces are one tiled OpenCL matmul kernel (``benchmarks/record_opencl_matmul.py``) recorded at
256^3 on an AMD EPYC PoCL host (``benchmarks/spaces/opencl_matmul_pocl.json``) and at 128^3, 256^3
and 512^3 on an Intel Xeon PoCL host (``benchmarks/spaces/warm_start/``, the same 300-configuration
sample at each size: ``benchmarks/warm_start_record.py``).

Each scenario is a target space and the earlier runs it may warm-start from. Per seed, every earlier
run is simulated honestly: the default tuner (bayesian) with ``--source-budget`` evaluations on the
source space, its correct trials written to a real store (``perf_records``, as the tuning stage
writes them) in a run folder, or, for the EPYC run, to a Kernel Tuner cache file. The target tuning
then reads that performance-database directory through :func:`kfoundry.core.warm_start.load_sources`,
seeds ``--warm-seeds`` configurations with :func:`~kfoundry.core.warm_start.rank_seeds` and runs the
tuner; the cold run is the same tuner and seed with no seeds. Seeds count as evaluations.

Printed per scenario and tuner: the median number of evaluations to come within 10% and within 5%
of the target's optimum (">B": the median run did not within the budget), and the median best/optimum
after 10 and 25 evaluations, cold and warm.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from kfoundry.core import warm_start  # noqa: E402
from kfoundry.core.plugins import get_plugin  # noqa: E402
from kfoundry.core.recorded import CacheWriter, RecordedSpace, replay_objective  # noqa: E402
from kfoundry.core.store import Store  # noqa: E402
from kfoundry.core.tuner import Budget, run_tuner  # noqa: E402

SPACES = Path(__file__).parent / "spaces"
EPYC_256 = SPACES / "opencl_matmul_pocl.json"
XEON = {n: SPACES / "warm_start" / f"opencl_matmul_xeon_{n}.json" for n in (128, 256, 512)}
#: name -> (target, earlier runs)
SCENARIOS: dict[str, tuple[Path, list[Path]]] = {
    "Xeon 256 <- Xeon 128 (shape)": (XEON[256], [XEON[128]]),
    "Xeon 256 <- Xeon 512 (shape)": (XEON[256], [XEON[512]]),
    "Xeon 256 <- EPYC 256 (device)": (XEON[256], [EPYC_256]),
    "Xeon 256 <- Xeon 128+512, EPYC 256": (XEON[256], [XEON[128], XEON[512], EPYC_256]),
    "Xeon 512 <- Xeon 256 (shape)": (XEON[512], [XEON[256]]),
    "Xeon 512 <- Xeon 128 (shape)": (XEON[512], [XEON[128]]),
    "Xeon 128 <- Xeon 256 (shape)": (XEON[128], [XEON[256]]),
    "Xeon 128 <- EPYC 256 (device+shape)": (XEON[128], [EPYC_256]),
}
KERNEL = "matmul-tiled"  # one kernel template in every space
TUNERS = ("random", "bayesian", "nevergrad")

_loaded: dict[Path, RecordedSpace] = {}


def space_of(path: Path) -> RecordedSpace:
    if path not in _loaded:
        _loaded[path] = RecordedSpace.load(path)
    return _loaded[path]


def shapes_of(recorded: RecordedSpace) -> dict[str, int]:
    m, n, k = recorded.problem_size
    return {"M": m, "N": n, "K": k}


def values_of(
    recorded: RecordedSpace, tuner: str, seed: int, budget: int, seeds: Sequence[dict] = ()
) -> list:
    trace = run_tuner(
        recorded.space(),
        replay_objective(recorded),
        get_plugin("tuner", tuner).build({}),
        Budget(evaluations=budget),
        seeds=seeds,
        seed=seed,
    )
    return [(t.config, t.value) for t in trace.trials]


def write_earlier_runs(folder: Path, sources: Sequence[Path], seed: int, budget: int) -> None:
    """Each earlier run's correct trials, as the tuning stage leaves them (a store or a cache file)."""
    for i, path in enumerate(sources):
        recorded = space_of(path)
        trials = values_of(recorded, "bayesian", 1000 + seed, budget)
        if path == EPYC_256:  # a Kernel Tuner cache file from another machine
            writer = CacheWriter(
                folder / f"earlier_{i}.json",
                device_name=recorded.device_name,
                kernel_name="matmul",
                problem_size=recorded.problem_size,
                tune_params=recorded.tune_params,
            )
            for config, _ in trials:
                writer.add_measurement(config, recorded.measure(config))
            writer.close()
            continue
        run_dir = folder / f"run_{i}"
        run_dir.mkdir()
        context = warm_start.Context(KERNEL, "matmul", recorded.device_name, shapes_of(recorded))
        with Store(run_dir / "kfoundry.db") as store:
            for config, value in trials:
                if value is not None:
                    warm_start.remember(store, f"run_{i}", context, "opencl", config, value)


def evals_to(values: Sequence[float | None], target: float) -> float:
    return next((float(i) for i, v in enumerate(values, 1) if v is not None and v <= target), math.inf)


def best_after(values: Sequence[float | None], n: int, optimum: float) -> float:
    valid = [v for v in values[:n] if v is not None]
    return min(valid) / optimum if valid else math.inf


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def fmt_evals(x: float, budget: int) -> str:
    return f"{x:.0f}" if math.isfinite(x) and x <= budget else f">{budget}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="repetitions per scenario and tuner")
    parser.add_argument("--budget", type=int, default=60, help="evaluations of the target tuning")
    parser.add_argument("--source-budget", type=int, default=30, help="evaluations of each earlier run")
    parser.add_argument("--warm-seeds", type=int, default=3, help="configurations seeded (tuner.warm_seeds)")
    parser.add_argument("--tuners", default=",".join(TUNERS))
    parser.add_argument("--exclude", default="", help="leave out scenarios whose name contains this")
    parser.add_argument("--only", default="", help="only the scenarios whose name contains this")
    args = parser.parse_args(argv)
    tuners = args.tuners.split(",")
    scenarios = {
        k: v
        for k, v in SCENARIOS.items()
        if all(p.is_file() for p in [v[0], *v[1]])
        and not (args.exclude and args.exclude in k)
        and args.only in k
    }
    if not scenarios:
        raise SystemExit("no recorded spaces: run benchmarks/warm_start_record.py first")
    print(
        f"seeds {args.seeds}, target budget {args.budget}, earlier runs {args.source_budget} evaluations "
        f"(bayesian), {args.warm_seeds} warm seeds; cold -> warm"
    )
    header = f"{'scenario':38} {'tuner':10} {'evals to 10%':>14} {'evals to 5%':>14} {'best@10':>13} {'best@25':>13}"
    print(header)
    print("-" * len(header))
    saved: list[float] = []
    start = time.perf_counter()
    for name, (target_path, sources) in scenarios.items():
        target = space_of(target_path)
        space = target.space()
        context = warm_start.Context(KERNEL, "matmul", target.device_name, shapes_of(target))
        warm_by_seed: dict[int, list[dict]] = {}
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                write_earlier_runs(Path(tmp), sources, seed, args.source_budget)
                records = warm_start.load_sources([tmp])
            warm_by_seed[seed] = warm_start.rank_seeds(records, space, context, args.warm_seeds)
        for tuner in tuners:
            rows: dict[str, list[list[float]]] = {"cold": [[], [], [], []], "warm": [[], [], [], []]}
            for seed in range(args.seeds):
                for kind, seeds in (("cold", []), ("warm", warm_by_seed[seed])):
                    values = [v for _, v in values_of(target, tuner, seed, args.budget, seeds)]
                    row = rows[kind]
                    row[0].append(evals_to(values, target.optimum * 1.10))
                    row[1].append(evals_to(values, target.optimum * 1.05))
                    row[2].append(best_after(values, 10, target.optimum))
                    row[3].append(best_after(values, 25, target.optimum))
            cold, warm = ([median(c) for c in rows[k]] for k in ("cold", "warm"))
            cells = [
                f"{fmt_evals(cold[i], args.budget):>5} -> {fmt_evals(warm[i], args.budget):<5}"
                for i in (0, 1)
            ]
            cells += [f"{cold[i]:.3f} -> {warm[i]:.3f}" for i in (2, 3)]
            print(
                f"{name:38} {tuner:10} {cells[0]:>14} {cells[1]:>14} {cells[2]:>13} {cells[3]:>13}",
                flush=True,
            )
            if math.isfinite(cold[1]) and math.isfinite(warm[1]):
                saved.append(1 - warm[1] / cold[1])
    if saved:
        print(f"\nmedian share of evaluations to 5% saved (where both reached it): {median(saved):.0%}")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
