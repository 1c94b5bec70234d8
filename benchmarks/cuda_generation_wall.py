"""Wall time of one generation: N distinct candidates judged with 1 and 4 workers, compile cache cold and warm.

    python benchmarks/cuda_generation_wall.py --backend cuda            # on the GPU machine
    python benchmarks/cuda_generation_wall.py --backend opencl -n 4     # PoCL, anywhere

The candidates are the example kernel of the problem (``examples/kernelbench/cuda/softmax_cuda.py`` or
``seeds/softmax_opencl.py``), each with a distinct comment in its kernel source, so every one is its own
program to compile (as a generation's proposals are). Each setting judges the whole generation as one
batch through the local executor: the builds (compiles in the confined compile step) overlap, while
correctness and timing take the device's lane one job at a time. ``cold``: an empty compile cache;
``warm``: the cache the cold run of the same worker count filled (a fresh store, so no evaluation is
served from it). The reference's timing and a warm-up job are not counted. Prints one table: the
generation's wall time, compile seconds summed over the jobs, seconds in the device lane summed,
candidates per minute, and kernels served from the compile cache.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = {
    "cuda": ROOT / "examples" / "kernelbench" / "cuda" / "softmax_cuda.py",
    "opencl": ROOT / "examples" / "kernelbench" / "seeds" / "softmax_opencl.py",
}
#: Problem sizes: the problem's own (a GPU size) on CUDA, a small one on PoCL.
SHAPES: dict[str, dict[str, int]] = {"cuda": {}, "opencl": {"batch_size": 8, "dim": 520}}


def candidates(backend: str, n: int, salt: str) -> list[Any]:
    """``n`` distinct candidates: the example with a comment of its own in every kernel source."""
    from kfoundry.core.models import Candidate

    source = EXAMPLE[backend].read_text()
    if 'SRC = r"""' not in source:
        raise SystemExit(f'{EXAMPLE[backend]}: no SRC = r""" kernel source to vary')
    return [
        Candidate(
            source=source.replace('SRC = r"""', f'SRC = r"""\n// candidate {salt}-{i}\n', 1), language=backend
        )
        for i in range(n)
    ]


def config(backend: str, workers: int, cache: bool) -> Any:
    from kfoundry.core.config import load_config

    return load_config(
        data={
            "backend": {"name": backend},
            "executor": {"name": "local", "options": {"workers": workers}},
            "evaluation": {"compile_cache": cache, "shape_variants": 0 if backend == "cuda" else 2},
        },
        validate_plugins=False,
    )


def generation(
    backend: str, folder: Path, store_name: str, workers: int, cands: list[Any], cache: bool
) -> dict[str, float]:
    """Judge ``cands`` as one batch; the measured numbers."""
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.models import Outcome
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    problem = load_problem(ROOT / "examples" / "kernelbench" / "softmax.py", SHAPES[backend])
    store = Store(folder / store_name)
    with Evaluator(problem, config(backend, workers, cache), store=store, run_id=store_name) as ev:
        ev.reference_timing()
        jobs = [ev._job("evaluate", c) for c in cands]  # the Evaluator's own jobs, results kept raw
        started = time.perf_counter()
        results = [r for _, r in ev.executor.run_iter(jobs)]
        wall = time.perf_counter() - started
    bad = [r.message[:200] for r in results if r.outcome is not Outcome.correct]
    if bad:
        print(f"  note: {len(bad)} candidate(s) not correct: {bad[0]}", file=sys.stderr)
    lane = [
        r.phase_times["device"][1] - r.phase_times["device"][0] for r in results if "device" in r.phase_times
    ]
    return {
        "wall_s": wall,
        "compile_s": sum(r.compile_time_s or 0.0 for r in results),
        "bench_s": sum(lane),
        "per_min": len(cands) / wall * 60,
        "cached": sum(1 for r in results for c in r.compiles if c.get("cached")),
        "programs": sum(len(r.compiles) for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(EXAMPLE), default="cuda")
    parser.add_argument("-n", "--candidates", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    if args.candidates < 1 or any(w < 1 for w in args.workers):
        print("cuda_generation_wall: --candidates and --workers must be at least 1", file=sys.stderr)
        raise SystemExit(2)
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="kf-genwall-") as tmp:
        # warm-up: the fork server's start and the reference's timing, not counted
        generation(
            args.backend, Path(tmp) / "warmup", "w.sqlite", 1, candidates(args.backend, 1, "warmup"), True
        )
        for workers in args.workers:
            folder = Path(tmp) / f"w{workers}"  # one compile cache per worker count: cold, then warm
            cands = candidates(args.backend, args.candidates, f"w{workers}")
            rows.append(
                (
                    f"{workers} worker(s), no cache",
                    generation(args.backend, folder / "off", "o.sqlite", workers, cands, False),
                )
            )
            rows.append(
                (
                    f"{workers} worker(s), cache cold",
                    generation(args.backend, folder, "cold.sqlite", workers, cands, True),
                )
            )
            rows.append(
                (
                    f"{workers} worker(s), cache warm",
                    generation(args.backend, folder, "warm.sqlite", workers, cands, True),
                )
            )
    print(
        f"\none generation of {args.candidates} distinct {args.backend} softmax candidates (local executor)\n"
    )
    print(
        "| setting | wall s | compile s (sum) | device lane s (sum) | candidates/min | programs from cache |"
    )
    print("|---|---|---|---|---|---|")
    for name, r in rows:
        print(
            f"| {name} | {r['wall_s']:.2f} | {r['compile_s']:.2f} | {r['bench_s']:.2f} | {r['per_min']:.1f} "
            f"| {int(r['cached'])}/{int(r['programs'])} |"
        )


if __name__ == "__main__":
    main()
