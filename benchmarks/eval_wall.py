"""Wall time of ``kf-run eval`` on honest candidates: this tree against another checkout, side by side.

    git worktree add /tmp/kf-base <commit>      # the tree to compare against
    python benchmarks/eval_wall.py --baseline /tmp/kf-base [--repeats 3]

Each repeat runs every (problem, candidate) once with each tree, alternating, in fresh processes
(``--no-cache``, a fresh store each time), and the table gives the median wall seconds per tree and
their ratio. Timings on a shared 2-core machine are noisy: compare the ratio, not the seconds.
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

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("vector_add", "seeds/vector_add_opencl.py"),
    ("softmax", "improved/softmax_opencl.py"),
    ("matmul", "improved/matmul_opencl.py"),
]


def _run(tree: Path, problem: str, candidate: str) -> tuple[float, str]:
    examples = ROOT / "examples" / "kernelbench"
    env = dict(os.environ, PYTHONPATH=str(tree))
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-c",
            "from kfoundry.core.cli import main; main()",
            "eval",
            str(examples / f"{problem}.py"),
            str(examples / candidate),
            "--no-cache",
            "--set",
            f"output_dir={out}",
        ]
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - start
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    verdict = next(
        (ln.split()[0] for ln in lines if ln.split() and ln.split()[0] in ("correct", "correct:")), ""
    )
    return wall, verdict or (lines[0][:40] if lines else done.stderr.strip()[-80:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another kfoundry checkout")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trees = {"baseline": args.baseline.resolve(), "this": ROOT}
    walls: dict[tuple[str, str], list[float]] = {}
    verdicts: dict[tuple[str, str], str] = {}
    for _ in range(args.repeats):
        for problem, candidate in CASES:
            for name, tree in trees.items():
                wall, verdict = _run(tree, problem, candidate)
                walls.setdefault((problem, name), []).append(wall)
                verdicts[(problem, name)] = verdict
    print(f"| problem | baseline s (median of {args.repeats}) | this tree s | ratio | verdicts |")
    print("|---|---|---|---|---|")
    for problem, _ in CASES:
        base = statistics.median(walls[(problem, "baseline")])
        this = statistics.median(walls[(problem, "this")])
        print(
            f"| {problem} | {base:.1f} | {this:.1f} | {this / base:.2f} | "
            f"{verdicts[(problem, 'baseline')]} / {verdicts[(problem, 'this')]} |"
        )


if __name__ == "__main__":
    main()
