"""The example problems on a CUDA GPU: verdict, median time, speedup over torch eager and
torch.compile, share of the roofline, and our timer against ``triton.testing.do_bench``.

Each CUDA candidate (examples/kernelbench/cuda/<problem>_*.py) goes through the real evaluator
(sandboxed worker, fresh random inputs per trial, poisoned outputs, anti-cheat guard, timer).
Then, in this process, the eager reference, ``torch.compile`` of it and the best candidate are each
timed by our timer three times (run-to-run spread = (max - min) / median of the three medians) and
by ``triton.testing.do_bench`` (median; it flushes the L2 before every run).

    python benchmarks/cuda_examples.py                       # Level-1-scale shapes (GPU machine)
    python benchmarks/cuda_examples.py --small --only softmax --no-compile
    python benchmarks/cuda_examples.py --candidates DIR      # other candidates (e.g. the offline generator's)

Roofline: bytes of inputs + outputs over the device's peak bandwidth, FLOPs over its fp32 peak
(measured peaks when ``kf-run devices --measure`` stored them; else the datasheet table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: Problem -> (shape overrides, what KernelBench Level 1 uses for the same operation).
LEVEL1: dict[str, tuple[dict[str, int], str]] = {
    "softmax": (
        {"batch_size": 4096, "dim": 65536},
        "KB 23_Softmax is 4096 x 393216; rows here 65536 (1 GiB)",
    ),
    "layer_norm": (
        {"batch_size": 16, "features": 64 * 256 * 256},
        "KB 40_LayerNorm (16, 64, 256, 256) over the last 3 dims",
    ),
    "rms_norm": (
        {"batch_size": 16384, "features": 16384},
        "KB 36_RMSNorm_ reduces dim 1 of (112, 64, 512, 512); here rows of 16384 (1 GiB)",
    ),
    "gelu": ({"N": 4096 * 65536}, "KB 26_GELU_ is 4096 x 393216; here 4096 x 65536 (1 GiB)"),
    "sum_reduction": (
        {"batch_size": 16, "dim1": 4096, "dim2": 4095},
        "KB 47 is (128, 4096, 4095) over dim 1; batch 16 here (1 GiB)",
    ),
    "matmul": ({"M": 4096, "K": 4096, "N": 4096}, "KB 1_Square_matrix_multiplication_ N = 4096"),
    "depthwise_conv2d": (
        {"batch_size": 16, "channels": 64, "height": 512, "width": 512, "kernel_size": 3},
        "KB 82-style depthwise 3x3, (16, 64, 512, 512)",
    ),
    "rotary_embedding": (
        {"batch_size": 16, "seq_len": 4096, "heads": 32, "head_dim": 128},
        "not in KB; LLaMA-like (1 GiB)",
    ),
}


def evaluate_candidates(
    name: str, shapes: dict[str, int], files: list[Path], trials: int, timeout: float
) -> tuple[Any, list[dict[str, Any]]]:
    """Every candidate file through the sandboxed evaluator; returns (problem, rows)."""
    from kfoundry.core.config import load_config
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.models import Candidate
    from kfoundry.core.problem import load_problem

    config = load_config(
        data={
            "backend": {"name": "cuda"},
            "executor": {"name": "local"},
            "evaluation": {"timeout_s": timeout, "cache": False, "memory_limit_mb": None, "trials": trials},
        },
        validate_plugins=False,
    )
    problem = load_problem(ROOT / "examples/kernelbench" / f"{name}.py", shapes)
    rows = []
    with Evaluator(problem, config) as evaluator:
        for path in files:
            candidate = Candidate(source=path.read_text(), language="cuda", label=path.name)
            started = time.perf_counter()
            record = evaluator.evaluate(candidate)
            timing = record.timing
            rows.append(
                {
                    "problem": name,
                    "candidate": path.name,
                    "outcome": record.outcome.value,
                    "message": record.message.splitlines()[0][:200] if record.message else "",
                    "median_ms": timing.median_ms if timing else None,
                    "spread": timing.spread if timing else None,
                    "reference_ms": record.reference_timing.median_ms if record.reference_timing else None,
                    "speedup_eager": record.speedup,
                    "roofline": record.roofline_fraction,
                    "roofline_flag": record.roofline_flag,
                    "compile_s": record.compile_time_s,
                    "resources": record.resources,
                    "wall_s": round(time.perf_counter() - started, 1),
                    "source": str(path),
                }
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "resources"}), flush=True)
    return problem, rows


def time_inprocess(problem: Any, best: Path | Any | None, compile_ref: bool) -> dict[str, Any]:
    """Eager, torch.compile and the best candidate, each by our timer (x3) and by do_bench."""
    import torch
    import triton.testing

    from kfoundry import runtime
    from kfoundry.core.evaluation.timer import measure
    from kfoundry.core.models import Candidate
    from kfoundry.core.peaks import roofline_fraction
    from kfoundry.plugins.backends.cuda import CudaBackend

    backend = CudaBackend()
    device = backend.select_device(0)
    runtime.set_backend(backend)
    inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in problem.make_inputs(12345)]
    reference = problem.make_reference().cuda()
    contenders: dict[str, Any] = {"eager": reference}
    if compile_ref:
        contenders["torch.compile"] = torch.compile(problem.make_reference().cuda())
    if best is not None:  # a candidate file, or a Candidate (with its tuned parameters)
        candidate = Candidate(source=best.read_text(), language="cuda") if isinstance(best, Path) else best
        contenders["candidate"] = problem.build_candidate(candidate, runtime.load).cuda()
    analysis = problem.analysis()
    out: dict[str, Any] = {}
    with torch.no_grad():
        expected = reference(*inputs)
        for label, model in contenders.items():
            try:
                started = time.perf_counter()
                got = model(*inputs)  # warm-up (torch.compile compiles here)
                torch.cuda.synchronize()
                first_s = time.perf_counter() - started
                err = float((got.double() - expected.double()).norm() / expected.double().norm())
                medians, device_medians = [], []
                for _ in range(3):
                    stats = measure(
                        lambda i, m=model: m(*inputs),
                        backend.synchronize,
                        warmup_s=0.1,
                        target_time_s=0.3,
                        min_repeats=10,
                        max_repeats=200,
                    )
                    medians.append(stats.median_ms)
                    stats = measure(
                        lambda i, m=model: m(*inputs),
                        backend.synchronize,
                        warmup_s=0.1,
                        target_time_s=0.3,
                        min_repeats=10,
                        max_repeats=200,
                        device_timer=backend.device_timer(),
                    )
                    device_medians.append(stats.median_ms)
                dobench = triton.testing.do_bench(
                    lambda m=model: m(*inputs), warmup=50, rep=300, return_mode="median"
                )
            except Exception as exc:  # torch.compile can fail on a new shape; report, go on
                out[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                continue
            host = statistics.median(medians)
            ours = statistics.median(device_medians)
            out[label] = {
                "ours_ms": ours,
                "ours_runs_ms": device_medians,
                "run_to_run_spread": (max(device_medians) - min(device_medians)) / ours,
                "do_bench_ms": dobench,
                "ours_vs_do_bench": ours / dobench - 1.0,
                "host_ms": host,
                "host_runs_ms": medians,
                "host_spread": (max(medians) - min(medians)) / host,
                "host_vs_do_bench": host / dobench - 1.0,
                "rel_error": err,
                "first_call_s": first_s,
                "roofline": roofline_fraction(device, ours / 1e3, analysis.bytes_moved, analysis.flops),
            }
            print(json.dumps({"problem": problem.name, "timed": label, **out[label]}), flush=True)
    out["bytes_moved"] = analysis.bytes_moved
    out["flops"] = analysis.flops
    out["device"] = device.model_dump(
        mode="json", include={"name", "peak_bandwidth_gbs", "peak_gflops", "peaks_measured"}
    )
    return out


def _pct(value: float | None) -> str:
    return f"{100 * value:.0f}%" if value is not None else "-"


def _ms(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table: one row per problem (best correct candidate)."""
    lines = [
        "| problem | candidate | verdict | median ms | eager ms | compile ms | x eager | x compile | roofline | ours/do_bench | spread | host/do_bench |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        best = r.get("best") or (r["candidates"][0] if r["candidates"] else {})
        timed = r.get("timed", {})
        eager = timed.get("eager", {}).get("ours_ms")
        comp = timed.get("torch.compile", {}).get("ours_ms")
        cand = timed.get("candidate", {})
        mine = cand.get("ours_ms") or best.get("median_ms")
        lines.append(
            f"| {r['problem']} | {best.get('candidate', '-')} | {best.get('outcome', '-')} | {_ms(mine)} | {_ms(eager)} | {_ms(comp)} | "
            f"{(eager / mine) if eager and mine else float('nan'):.2f} | {(comp / mine) if comp and mine else float('nan'):.2f} | "
            f"{_pct(cand.get('roofline') or best.get('roofline'))} | "
            f"{cand.get('ours_vs_do_bench', float('nan')) * 100:+.1f}% | {_pct(cand.get('run_to_run_spread'))} | "
            f"{cand.get('host_vs_do_bench', float('nan')) * 100:+.1f}% |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="the example files' own (small) shapes")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--candidates", type=Path, default=ROOT / "examples/kernelbench/cuda")
    parser.add_argument("--inline", action="store_true", help="also evaluate load_inline candidates")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    parser.add_argument("--no-inprocess", dest="inprocess", action="store_false", help="evaluator only")
    parser.add_argument("--skip-eval", action="store_true", help="only the in-process timer comparison")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    results = []
    for name, (shapes, note) in LEVEL1.items():
        if args.only and name not in args.only:
            continue
        files = sorted(
            p for p in args.candidates.glob(f"{name}_*.py") if args.inline or "load_inline" not in p.name
        )
        if not files:
            print(json.dumps({"problem": name, "skipped": "no candidate"}), flush=True)
            continue
        used = {} if args.small else shapes
        if args.skip_eval:  # timer comparison only: no sandboxed evaluation
            from kfoundry.core.problem import load_problem

            problem = load_problem(ROOT / "examples/kernelbench" / f"{name}.py", used)
            entry = {
                "problem": name,
                "shapes": used,
                "note": note,
                "candidates": [],
                "best": {"candidate": files[0].name, "outcome": "not evaluated", "source": str(files[0])},
            }
            entry["timed"] = time_inprocess(problem, files[0], False)
            results.append(entry)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
            continue
        problem, rows = evaluate_candidates(name, used, files, args.trials, args.timeout)
        correct = [r for r in rows if r["outcome"] == "correct"]
        best = min(correct, key=lambda r: r["median_ms"]) if correct else None
        entry: dict[str, Any] = {
            "problem": name,
            "shapes": used,
            "note": note,
            "candidates": rows,
            "best": best,
        }
        if args.inprocess:
            entry["timed"] = time_inprocess(problem, Path(best["source"]) if best else None, args.compile)
        results.append(entry)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    md = table(results)
    if args.markdown:
        args.markdown.write_text(md + "\n")
    print("\n" + md)


if __name__ == "__main__":
    main()
