"""The offline generator on CUDA: ``kf-run PROBLEM`` (the real optimize loop: offline cookbook,
MAP-Elites, sandboxed evaluator, tuning stage) on each example it knows, at the Level-1-scale shapes
of benchmarks/cuda_examples.py. Then the best kernel of each run is timed in this process against
torch eager and torch.compile (our timer and do_bench), with its share of the roofline.

    python benchmarks/cuda_offline.py --out runs-h200 [--only softmax gelu] [--wall 45]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_examples import LEVEL1, ROOT, time_inprocess  # noqa: E402

#: The examples the offline cookbook covers for CUDA (depthwise conv and rotary need an LLM).
OFFLINE = ["softmax", "layer_norm", "rms_norm", "gelu", "sum_reduction", "matmul"]


def run_one(name: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    shapes, _ = LEVEL1[name]
    sets = {
        "backend.name": "cuda",
        "output_dir": str(out),
        "budget.generations": args.generations,
        "budget.proposals_per_generation": args.proposals,
        "budget.wall_time_s": args.wall,
        "tuner.name": "random",
        "tuner.every": 0,
        "tuner.evaluations": args.tune,
        "tuner.elites": 1,
        "evaluation.trials": args.trials,
        "evaluation.timeout_s": 120,
        "executor.options.workers": args.workers,
        **{f"problem.shapes.{k}": v for k, v in shapes.items()},
    }
    cmd = [
        sys.executable,
        "-c",
        "from kfoundry.core.cli import main; main()",
        str(ROOT / "examples/kernelbench" / f"{name}.py"),
    ]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.wall * 4 + 240)
    wall = time.perf_counter() - started
    tail = "\n".join(
        line for line in (proc.stdout + proc.stderr).splitlines() if "warning" not in line.lower()
    )[-1500:]
    runs = sorted(out.glob(f"{name}-*"), key=lambda p: p.stat().st_mtime)
    entry: dict[str, Any] = {"problem": name, "rc": proc.returncode, "wall_s": round(wall, 1), "tail": tail}
    if not runs or not (runs[-1] / "best.json").is_file():
        return entry
    best = json.loads((runs[-1] / "best.json").read_text())
    record, candidate = best["record"], best["candidate"]
    entry.update(
        run_dir=str(runs[-1]),
        best_label=candidate.get("label"),
        best_params=candidate.get("params"),
        outcome=record["outcome"],
        median_ms=(record.get("timing") or {}).get("median_ms"),
        speedup_eager=record.get("speedup"),
        roofline=record.get("roofline_fraction"),
    )
    path = out / f"best_{name}_cuda.json"
    path.write_text(json.dumps(candidate, indent=1))
    entry["best_file"] = str(path)
    entry["best_candidate"] = candidate
    return entry


def main() -> None:
    from kfoundry.core.models import Candidate
    from kfoundry.core.problem import load_problem

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("kf-runs-cuda"))
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--proposals", type=int, default=4)
    parser.add_argument("--wall", type=float, default=45.0, help="wall-time budget per run (s)")
    parser.add_argument("--tune", type=int, default=6, help="tuner evaluations for the best elite")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in OFFLINE:
        if args.only and name not in args.only:
            continue
        entry = run_one(name, args.out, args)
        print(json.dumps({k: v for k, v in entry.items() if k not in ("tail", "best_candidate")}), flush=True)
        if entry.get("best_file") and entry.get("outcome") == "correct":
            problem = load_problem(ROOT / "examples/kernelbench" / f"{name}.py", LEVEL1[name][0])
            best = Candidate.model_validate_json(Path(entry["best_file"]).read_text())
            entry["timed"] = time_inprocess(problem, best, args.compile)
        else:
            print(entry["tail"], flush=True)
        results.append(entry)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    print("\n| problem | best kernel | params | ms | x eager | x compile | roofline | run s |")
    print("|---|---|---|---|---|---|---|---|")
    for e in results:
        timed = e.get("timed", {})
        mine = timed.get("candidate", {}).get("ours_ms") or e.get("median_ms")
        eager = timed.get("eager", {}).get("ours_ms")
        comp = timed.get("torch.compile", {}).get("ours_ms")
        roof = timed.get("candidate", {}).get("roofline") or e.get("roofline")
        print(
            f"| {e['problem']} | {e.get('best_label', '-')} | {e.get('best_params', '-')} | {mine if mine else '-'} | "
            f"{(eager / mine) if eager and mine else float('nan'):.2f} | {(comp / mine) if comp and mine else float('nan'):.2f} | "
            f"{(100 * roof) if roof else float('nan'):.0f}% | {e['wall_s']} |"
        )


if __name__ == "__main__":
    main()
