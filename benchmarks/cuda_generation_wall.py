"""Wall time of one generation: N distinct candidates judged with 1 and 4 workers, compile cache cold and warm.

    python benchmarks/cuda_generation_wall.py --backend cuda                        # on the GPU machine
    python benchmarks/cuda_generation_wall.py --backend cuda --candidates offline -n 8
    python benchmarks/cuda_generation_wall.py --backend opencl --candidates offline -n 4 --workers 1 2

``--candidates example`` (the default): the example kernel of the problem
(``examples/kernelbench/cuda/softmax_cuda.py`` or ``seeds/softmax_opencl.py``) ``n`` times.
``--candidates offline``: a real first generation of the offline generator for the problem (its seeds,
one per cookbook recipe, then its *create* moves until there are ``n``), at the problem's own size on
CUDA; those recipes build their programs lazily inside ``forward``, one per shape set, so every program
of theirs is a load during the correctness trials. Every candidate gets a distinct comment in its
kernel source, so each is its own program to compile (as a generation's proposals are), and the
comment differs per worker count. Each setting judges the whole generation as one batch through the
local executor: builds and compiles (in the judge's confined compile step, with the device lane given
up) overlap, while correctness and timing take the device's lane one job at a time. ``cold``: an empty
compile cache; ``warm``: the cache the cold run of the same worker count filled (a fresh store, so no
evaluation is served from it). The reference's timing and a warm-up job are not counted. Prints one
table: the generation's wall time, compile seconds summed over the jobs (the compile service's where it
is on, else the runner's build), seconds the jobs held the device lane (summed: correctness and timing
less the time given up for compiles, plus the judge's clock calibration on a device), the time given up,
candidates per minute, programs served from the compile cache (or seeded by the candidate's compile
job: ``--settings compile-jobs``, wall time including the compile jobs), correct candidates, and jobs whose
calibration ran in the lane (GPU jobs; none on PoCL, where the judge does not calibrate).
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
SHAPES: dict[str, dict[str, int | float]] = {"cuda": {}, "opencl": {"batch_size": 8, "dim": 520}}


PROBLEM = ROOT / "examples" / "kernelbench" / "softmax.py"
#: Where a candidate's kernel source starts (the example's ``SRC``, the offline recipes' ``KERNEL_SOURCE``).
_KERNEL_MARKS = ('SRC = r"""', 'KERNEL_SOURCE = r"""')


def salted(candidate: Any, salt: str) -> Any:
    """``candidate`` with a comment of its own at the top of its kernel source (a distinct program)."""
    for mark in _KERNEL_MARKS:
        if mark in candidate.source:
            source = candidate.source.replace(mark, f"{mark}\n// candidate {salt}\n", 1)
            return candidate.model_copy(update={"source": source})
    raise SystemExit(f"cuda_generation_wall: a candidate has no {' or '.join(_KERNEL_MARKS)} kernel source")


def example_candidates(backend: str, n: int) -> list[Any]:
    """The problem's example kernel ``n`` times."""
    from kfoundry.core.models import Candidate

    return [Candidate(source=EXAMPLE[backend].read_text(), language=backend) for _ in range(n)]


def offline_candidates(backend: str, n: int) -> list[Any]:
    """The offline generator's first generation for the problem: its seeds, then create moves (``n``)."""
    from kfoundry.core.generator import GenerationRequest
    from kfoundry.core.plugins import get_plugin
    from kfoundry.core.problem import load_problem
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator

    problem = load_problem(PROBLEM, SHAPES[backend])
    device = get_plugin("backend", backend).build({}).select_device(None)
    request = GenerationRequest(problem=problem.summary(), language=backend, device=device, n=n)
    generator = OfflineGenerator()
    proposals = generator.seeds(request)
    seen = {p.candidate.content_hash for p in proposals if p.candidate is not None}
    for generation in range(1, 20):
        if len(seen) >= n:
            break
        more = generator.propose(
            request.model_copy(update={"generation": generation, "extra": {"avoid": sorted(seen)}})
        )
        for p in more:
            if p.candidate is not None and p.candidate.content_hash not in seen:
                seen.add(p.candidate.content_hash)
                proposals.append(p)
    out = [p.candidate for p in proposals if p.candidate is not None][:n]
    if len(out) < n:
        raise SystemExit(f"cuda_generation_wall: the offline generator made {len(out)} of {n} candidates")
    return out


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
    backend: str,
    folder: Path,
    store_name: str,
    workers: int,
    cands: list[Any],
    cache: bool,
    compile_first: bool = False,
) -> dict[str, float]:
    """Judge ``cands`` as one batch (``compile_first``: after a batch of their compile jobs, whose
    artefacts the benchmark jobs are given); the measured numbers."""
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.models import Outcome
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    problem = load_problem(PROBLEM, SHAPES[backend])
    (folder / store_name).parent.mkdir(parents=True, exist_ok=True)
    store = Store(folder / store_name)
    with Evaluator(problem, config(backend, workers, cache), store=store, run_id=store_name) as ev:
        ev.reference_timing()
        jobs = [ev._job("evaluate", c) for c in cands]  # the Evaluator's own jobs, results kept raw
        started = time.perf_counter()
        compiled: list[Any] = []
        if compile_first:  # device-free compile jobs (as Ray's compile tasks), then the benchmarks
            # no cache folder for them (as on another machine): only what they ship reaches the benchmarks
            compile_jobs = [j.model_copy(update={"kind": "compile", "compile_cache_dir": None}) for j in jobs]
            compiled = ev.executor.run(compile_jobs)
            jobs = [
                j.model_copy(update={"seed_artifacts": c.artifacts})
                for j, c in zip(jobs, compiled, strict=True)
            ]
        results = [r for _, r in ev.executor.run_iter(jobs)]
        wall = time.perf_counter() - started
    bad = [r.message[:200] for r in results if r.outcome is not Outcome.correct]
    if bad:
        print(f"  note: {len(bad)} candidate(s) not correct: {bad[0]}", file=sys.stderr)
    lane = [
        r.phase_times["device"][1] - r.phase_times["device"][0] for r in results if "device" in r.phase_times
    ]
    released = [
        b - a for r in results for k, (a, b) in r.phase_times.items() if k.startswith("lane_released_")
    ]
    service = sum(float(c.get("seconds") or 0.0) for r in [*compiled, *results] for c in r.compiles)
    calibrating = [r.phase_times["calibrate"] for r in results if "calibrate" in r.phase_times]
    return {
        "wall_s": wall,
        "compile_s": service if cache else sum(r.compile_time_s or 0.0 for r in results),
        "bench_s": sum(lane) - sum(released) + sum(b - a for a, b in calibrating),
        "calibrated": len(calibrating),
        "released_s": sum(released),
        "per_min": len(cands) / wall * 60,
        "cached": sum(1 for r in results for c in r.compiles if c.get("cached")),
        "seeded": sum(1 for r in results for c in r.compiles if c.get("seeded")),
        "programs": sum(len(r.compiles) for r in results),
        "correct": len(results) - len(bad),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(EXAMPLE), default="cuda")
    parser.add_argument("-n", "--count", type=int, default=8, help="candidates in the generation")
    parser.add_argument(
        "--candidates",
        choices=("example", "offline"),
        default="example",
        help="the example kernel n times, or the offline generator's first generation",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--settings",
        nargs="+",
        choices=("off", "cold", "warm", "compile-jobs"),
        default=["off", "cold", "warm"],
        help="compile cache off, cold (empty), warm (filled by the cold run: needs cold before it), "
        "compile-jobs (device-free compile jobs first, their artefacts seed the benchmark jobs)",
    )
    args = parser.parse_args()
    if args.count < 1 or any(w < 1 for w in args.workers):
        print("cuda_generation_wall: -n and --workers must be at least 1", file=sys.stderr)
        raise SystemExit(2)
    make = offline_candidates if args.candidates == "offline" else example_candidates
    base = make(args.backend, args.count)
    print(
        f"{len(base)} {args.candidates} candidates: "
        + ", ".join(str(c.meta.get("recipe", "example")) for c in base),
        file=sys.stderr,
    )
    print(
        f"\none generation of {args.count} distinct {args.backend} softmax candidates ({args.candidates}, "
        "local executor); rows print as they finish\n"
    )
    print(
        "| setting | wall s | compile s (sum) | device lane s (sum) | lane given up s | candidates/min "
        "| programs from cache | correct | calibrated in lane |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="kf-genwall-") as tmp:
        # warm-up: the fork server's start and the reference's timing, not counted
        generation(args.backend, Path(tmp) / "warmup", "w.sqlite", 1, [salted(base[0], "warmup")], True)
        for workers in args.workers:
            folder = Path(tmp) / f"w{workers}"  # one compile cache per worker count: cold, then warm
            cands = [salted(c, f"w{workers}-{i}") for i, c in enumerate(base)]
            for setting in args.settings:
                store, cache = {
                    "off": ("off/o.sqlite", False),
                    "cold": ("cold.sqlite", True),
                    "compile-jobs": ("seeded/s.sqlite", True),  # its own (empty) cache folder
                }.get(setting, ("warm.sqlite", True))
                r = generation(args.backend, folder, store, workers, cands, cache, setting == "compile-jobs")
                name = {
                    "off": "no cache",
                    "cold": "cache cold",
                    "warm": "cache warm",
                    "compile-jobs": "compile jobs first",
                }[setting]
                print(
                    f"| {workers} worker(s), {name} | {r['wall_s']:.2f} | {r['compile_s']:.2f} "
                    f"| {r['bench_s']:.2f} | {r['released_s']:.2f} | {r['per_min']:.1f} "
                    f"| {int(r['cached'])}/{int(r['programs'])}"
                    + (f" ({int(r['seeded'])} seeded)" if r["seeded"] else "")
                    + f" | {int(r['correct'])}/{len(cands)} "
                    f"| {int(r['calibrated'])}/{len(cands)} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
