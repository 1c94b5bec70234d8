"""Seed vs hand-improved OpenCL kernels, side by side in one run, on the default OpenCL device.

    python benchmarks/eval_table.py                 # softmax and matmul, default sizes
    python benchmarks/eval_table.py --all           # every example (seeds; improved where present)
    python benchmarks/eval_table.py --target-time 1.0 --shape matmul:M=512

Each problem gets one Evaluator: the reference is timed once by the same harness, then each kernel
is verified (5 fresh-input trials) and timed in its own sandboxed worker. Prints a table; the
"vs seed" column is the seed's median over this kernel's median.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kfoundry.core.config import load_config  # noqa: E402
from kfoundry.core.evaluation import Evaluator  # noqa: E402
from kfoundry.core.models import Candidate  # noqa: E402
from kfoundry.core.problem import load_problem, parse_shape_overrides  # noqa: E402

EXAMPLES = ROOT / "examples" / "kernelbench"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--all", action="store_true", help="every example problem, not only those with improved kernels"
    )
    parser.add_argument("--target-time", type=float, default=0.5, help="seconds of timing per kernel")
    parser.add_argument("--shape", action="append", default=[], metavar="PROBLEM:NAME=VALUE")
    parser.add_argument("--device", default=None, help="OpenCL device index or name substring")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    names = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    if not args.all:
        names = [n for n in names if (EXAMPLES / "improved" / f"{n}_opencl.py").exists()]
    shapes: dict[str, list[str]] = {}
    for item in args.shape:
        prob, _, assignment = item.partition(":")
        shapes.setdefault(prob, []).append(assignment)
    config = load_config(
        data={
            "evaluation": {"target_time_s": args.target_time, "cache": False, "max_repeats": 400},
            "backend": {"device": args.device},
        },
        validate_plugins=False,
    )
    table = Table(title="kfoundry: seed vs improved OpenCL kernels (median of timed runs, ms)")
    for col in (
        "problem",
        "kernel",
        "verdict",
        "median",
        "IQR",
        "95% CI",
        "n",
        "reference",
        "speedup",
        "vs seed",
    ):
        table.add_column(col, justify="right" if col not in ("problem", "kernel", "verdict") else "left")
    device = ""
    for name in names:
        problem = load_problem(EXAMPLES / f"{name}.py", parse_shape_overrides(shapes.get(name, [])))
        with Evaluator(problem, config) as evaluator:
            device = evaluator.device.name
            seed_ms: float | None = None
            for kind in ("seeds", "improved"):
                path = EXAMPLES / kind / f"{name}_opencl.py"
                if not path.exists():
                    continue
                record = evaluator.evaluate(Candidate(source=path.read_text(), label=path.name))
                t = record.timing
                ratio = ""
                if t is not None:
                    seed_ms = t.median_ms if kind == "seeds" else seed_ms
                    ratio = f"{seed_ms / t.median_ms:.2f}x" if seed_ms else ""
                ref = record.reference_timing
                table.add_row(
                    name,
                    kind.rstrip("s"),
                    record.outcome.value,
                    f"{t.median_ms:.3f}" if t else "-",
                    f"{t.iqr_ms:.3f}" if t else "-",
                    f"[{t.ci95_low_ms:.3f}, {t.ci95_high_ms:.3f}]" if t else "-",
                    str(t.n) if t else "-",
                    f"{ref.median_ms:.3f}" if ref else "-",
                    f"{record.speedup:.3f}x" if record.speedup else "-",
                    ratio,
                )
    console = Console(width=140)
    console.print(table)
    console.print(f"device: {device}; shapes: the examples' defaults unless --shape")


if __name__ == "__main__":
    main()
