"""What one correctness trial costs outside the kernel, at a given size, on a given torch device.

    python benchmarks/check_cost.py                                  # softmax 4096x65536 (1 GiB) on the CPU
    python benchmarks/check_cost.py --device cuda --shape batch_size=4096 --shape dim=393216
    python benchmarks/check_cost.py --problem examples/kernelbench/gelu.py --shape batch_size=4096

Per trial the worker draws the inputs, clones them twice (the reference's copy and the mutation
snapshot), runs the reference, and checks the output (poison, NaN/Inf, constant output, float64
comparison in chunks). The candidate's output is stood in for by the reference's own plus one ulp of
noise, so the full comparison runs. Prints the median of ``--repeats`` trials per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kfoundry.core.evaluation.verifier import check_trial  # noqa: E402
from kfoundry.core.problem import as_tensor_list, load_problem, parse_shape_overrides  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--problem", default=str(ROOT / "examples/kernelbench/softmax.py"))
    parser.add_argument("--shape", action="append", default=None, metavar="NAME=VALUE")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shapes = args.shape if args.shape is not None else ["batch_size=4096", "dim=65536"]
    problem = load_problem(args.problem, parse_shape_overrides(tuple(shapes)))
    device = torch.device(args.device)
    reference = problem.make_reference().to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    steps: dict[str, list[float]] = {"draw inputs": [], "clone x2": [], "reference": [], "check": []}
    nbytes = 0
    for seed in range(args.repeats):
        t0 = time.perf_counter()
        inputs = problem.make_inputs(seed + 1, device)
        sync()
        t1 = time.perf_counter()
        copies = [[v.clone() if isinstance(v, torch.Tensor) else v for v in inputs] for _ in range(2)]
        sync()
        t2 = time.perf_counter()
        with torch.no_grad():
            refs = as_tensor_list(reference(*copies[0]))
        sync()
        t3 = time.perf_counter()
        outs = [
            torch.nextafter(r, torch.full_like(r, float("inf"))) if r.is_floating_point() else r.clone()
            for r in refs
        ]
        sync()
        t4 = time.perf_counter()
        verdict = check_trial(outs, refs, inputs, copies[1], None, None)
        sync()
        t5 = time.perf_counter()
        assert verdict is None, verdict
        for name, (a, b) in zip(steps, [(t0, t1), (t1, t2), (t2, t3), (t4, t5)], strict=True):
            steps[name].append(b - a)
        nbytes = sum(v.numel() * v.element_size() for v in [*inputs, *refs] if isinstance(v, torch.Tensor))
        del inputs, copies, refs, outs

    table = Table(
        title=f"{Path(args.problem).stem} {' '.join(shapes)} on {device} ({nbytes / 2**30:.2f} GiB in+out), "
        f"median of {args.repeats}"
    )
    table.add_column("step")
    table.add_column("seconds", justify="right")
    for name, times in steps.items():
        table.add_row(name, f"{statistics.median(times):.3f}")
    table.add_row("per trial", f"{sum(statistics.median(t) for t in steps.values()):.3f}")
    Console().print(table)


if __name__ == "__main__":
    main()
