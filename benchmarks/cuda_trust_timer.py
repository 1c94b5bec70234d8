"""Can the judge's times be trusted? The sandboxed evaluator's median against ``triton.testing.do_bench``.

For each CUDA example candidate (examples/kernelbench/cuda/<problem>_cuda.py) at two shape sets --
``small`` (the problem file's own shapes: kernels well under 0.1 ms) and ``level1`` (cuda_examples.py's
LEVEL1 shapes, the leading dimension halved until the inputs fit ``--cap-mib``, default 256 MiB, so
input generation and the judge's host copies stay fast) -- this:

1. evaluates the candidate through ``kfoundry.core.evaluation.Evaluator`` (backend cuda, no cache,
   default timing settings, local executor with 1 worker): verdict, message, the record's median, and
   the judge's log lines saying the runner's CUDA events undercut its own clock (it used its own clock
   for those batches); the reference's median by the same judge (its undercut lines too);
2. in this process, builds the same candidate (``problem.build_candidate`` with ``kfoundry.runtime`` on
   the CUDA backend) and the eager reference, and times each with
   ``triton.testing.do_bench(..., warmup=50, rep=300, return_mode="median")`` on fresh inputs.

It prints a table (judge ms, do_bench ms, judge/do_bench - 1, for the candidate and the reference) and
one final line with the median and maximum absolute deviation.

    python benchmarks/cuda_trust_timer.py --json /tmp/trust.json     # GPU machine, ~5 minutes
    python benchmarks/cuda_trust_timer.py --only softmax gelu --sets small
    python benchmarks/cuda_trust_timer.py --plan                      # the rows and shapes; no GPU needed

Note: at 256 MiB the memory-bound problems run ~0.13-0.3 ms on an H200 (read + write at ~4 TB/s); the
matmul (4096^3) ~3.8 ms. ``--cap-mib 1024`` gives the 0.5 ms of the full LEVEL1 shapes, ~4x slower to run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "examples/kernelbench/cuda"
PROBLEMS = [
    "softmax",
    "gelu",
    "rms_norm",
    "layer_norm",
    "matmul",
    "sum_reduction",
    "rotary_embedding",
    "depthwise_conv2d",
]
#: Further candidates, with --extra (load_inline builds a torch extension: ~1 minute).
EXTRA = {"gelu": ["gelu_load_inline.py"], "matmul": ["matmul_tuned_cuda.py"]}
SETS = ["small", "level1"]
UNDERCUT = "device clock undercut"
_UNDERCUT_N = re.compile(r"undercut the judge's clock in (\d+) timed batches")


def _level1() -> dict[str, dict[str, int]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cuda_examples import LEVEL1  # stdlib-only at import

    return {name: dict(shapes) for name, (shapes, _note) in LEVEL1.items()}


def _input_bytes(problem: Any) -> int:
    """Bytes of the forward inputs (from the meta-device analysis: nothing allocated)."""
    import torch

    a = problem.analysis()
    return sum(
        math.prod(s) * torch.empty((), dtype=getattr(torch, d)).element_size()
        for s, d in zip(a.input_shapes, a.input_dtypes, strict=True)
    )


def plan_shapes(
    name: str, which: str, cap_bytes: int, level1: dict[str, dict[str, int]]
) -> tuple[dict[str, int | float], Any]:
    """(shape overrides, problem) of one row: the file's own shapes, or LEVEL1's with the leading
    dimension halved until the inputs fit ``cap_bytes``."""
    from kfoundry.core.problem import load_problem

    path = ROOT / "examples/kernelbench" / f"{name}.py"
    if which == "small":
        return {}, load_problem(path, {})
    shapes: dict[str, int | float] = dict(level1[name])
    problem = load_problem(path, shapes)
    lead = next(iter(shapes))
    while (
        _input_bytes(problem) > cap_bytes * 1.02 and shapes[lead] > 1
    ):  # ~: small side inputs (rotary's cos/sin)
        shapes[lead] = max(1, int(shapes[lead]) // 2)
        problem = load_problem(path, shapes)
    return shapes, problem


def _shape_label(problem: Any) -> str:
    shapes = problem.analysis().input_shapes
    return "x".join(str(d) for d in shapes[0]) if shapes else "-"


def _first_line(text: str | None, n: int = 300) -> str:
    return (text or "").strip().splitlines()[0][:n] if (text or "").strip() else ""


def _undercut(log: str | None) -> tuple[list[str], int]:
    lines = [ln.strip() for ln in (log or "").splitlines() if UNDERCUT in ln]
    count = sum(int(m.group(1)) for ln in lines if (m := _UNDERCUT_N.search(ln)))
    return lines, count


def _dev(judge: float | None, bench: float | None) -> float | None:
    if judge is None or bench is None or not bench > 0:
        return None
    return judge / bench - 1.0


# -- the two measurements -------------------------------------------------------------------------


def judge_row(problem: Any, candidate_path: Path, timeout_s: float) -> dict[str, Any]:
    """The sandboxed evaluator on one candidate: verdict, the record's and the reference's medians."""
    from kfoundry.core.config import load_config
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.models import Candidate, Outcome

    config = load_config(
        data={
            "backend": {"name": "cuda"},
            "executor": {"name": "local", "options": {"workers": 1}},
            # timing settings left at their defaults; CUDA reserves far more address space than 8 GiB
            "evaluation": {"cache": False, "timeout_s": timeout_s, "memory_limit_mb": None},
        },
        validate_plugins=False,
    )
    out: dict[str, Any] = {}
    candidate = Candidate(source=candidate_path.read_text(), language="cuda", label=candidate_path.name)
    with Evaluator(problem, config) as evaluator:
        # The reference job directly (its log holds the judge's undercut lines, which reference_timing()
        # drops), then primed into the evaluator so evaluate() does not time it again.
        ref_started = time.perf_counter()
        try:
            result = evaluator.executor.run([evaluator._job("reference")])[0]
            out["ref_undercut_lines"], out["ref_undercut_batches"] = _undercut(result.log)
            if result.outcome is Outcome.correct and result.timing is not None:
                evaluator._reference = result.timing
            else:
                out["ref_error"] = _first_line(f"reference: {result.outcome.value}: {result.message}")
        except Exception as exc:  # private API moved: the public path (no reference log)
            out["ref_note"] = f"reference log unavailable ({type(exc).__name__}: {exc})"[:200]
        try:
            ref = evaluator.reference_timing()
            out["judge_ref_ms"] = ref.median_ms
            out["judge_ref_n"] = ref.n
            out["judge_ref_spread"] = ref.spread
        except Exception as exc:
            out.setdefault("ref_error", _first_line(f"{type(exc).__name__}: {exc}"))
        out["ref_wall_s"] = round(time.perf_counter() - ref_started, 1)
        started = time.perf_counter()
        record = evaluator.evaluate(candidate)
        out["eval_wall_s"] = round(time.perf_counter() - started, 1)
    out["verdict"] = record.outcome.value
    out["message"] = _first_line(record.message)
    out["undercut_lines"], out["undercut_batches"] = _undercut(record.log)
    out["phases"] = next((ln.strip() for ln in record.log.splitlines() if ln.startswith("judge phases")), "")
    clock_keys = ("clock pairs", "differential clock", "per-call overhead", "exchange overhead")
    out["clock"] = [ln.strip()[:600] for ln in record.log.splitlines() if any(k in ln for k in clock_keys)]
    if record.timing is not None:
        out["judge_ms"] = record.timing.median_ms
        out["judge_n"] = record.timing.n
        out["judge_spread"] = record.timing.spread
    if record.reference_timing is not None:
        out["judge_ref_ms"] = record.reference_timing.median_ms
    return out


def bench_row(problem: Any, candidate_path: Path, warmup: int, rep: int) -> dict[str, Any]:
    """In this process: candidate and eager reference by do_bench (median) on fresh inputs."""
    import torch
    import triton.testing

    from kfoundry import runtime
    from kfoundry.core.models import Candidate

    backend = _backend()
    # as the judge (worker._strict_fp32) and its forked runner: no TF32 in matmuls or cuDNN convolutions
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out: dict[str, Any] = {}
    inputs = [
        t.cuda() if isinstance(t, torch.Tensor) else t for t in problem.make_inputs(987_654_321, "cuda")
    ]
    models: dict[str, Any] = {"ref": problem.make_reference().cuda()}
    try:
        runtime.set_backend(backend)
        candidate = Candidate(source=candidate_path.read_text(), language="cuda", label=candidate_path.name)
        models["cand"] = problem.build_candidate(candidate, runtime.load).cuda()
    except Exception as exc:
        out["bench_error"] = _first_line(f"build: {type(exc).__name__}: {exc}")
    try:
        with torch.no_grad():
            expected = models["ref"](*inputs)
            for label, model in models.items():
                try:
                    got = model(*inputs)
                    torch.cuda.synchronize()
                    if label == "cand":
                        with contextlib.suppress(Exception):  # a sanity figure only (the judge checks)
                            e, g = expected.double(), got.double()
                            out["rel_error"] = float((g - e).norm() / max(float(e.norm()), 1e-30))
                    del got
                    key = "do_bench_ms" if label == "cand" else "do_bench_ref_ms"
                    out[key] = float(
                        triton.testing.do_bench(
                            lambda m=model, a=inputs: m(*a), warmup=warmup, rep=rep, return_mode="median"
                        )
                    )
                except Exception as exc:
                    out[f"bench_{label}_error"] = _first_line(f"{type(exc).__name__}: {exc}")
    finally:
        models.clear()
        inputs.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return out


_BACKEND: Any = None


def _backend() -> Any:
    global _BACKEND
    if _BACKEND is None:
        from kfoundry.plugins.backends.cuda import CudaBackend

        _BACKEND = CudaBackend()
        _BACKEND.select_device(0)
    return _BACKEND


def require_cuda() -> str | None:
    """None when a CUDA device, torch with CUDA and Triton are here; else why not (one line)."""
    try:
        import torch
    except Exception as exc:
        return f"torch does not import ({type(exc).__name__}: {exc})"
    try:
        from kfoundry.plugins.backends.cuda import CudaBackend

        caps = CudaBackend().capabilities()
    except Exception as exc:
        return f"the CUDA backend does not load ({type(exc).__name__}: {exc})"
    if not caps.can_run:
        return f"no CUDA device: {caps.reason}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    try:
        import triton.testing  # noqa: F401
    except Exception as exc:
        return f"triton.testing does not import ({type(exc).__name__}: {exc}): do_bench is needed"
    return None


# -- output ---------------------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    return f"{v:.4f}" if isinstance(v, (int, float)) else "-"


def _pc(v: float | None) -> str:
    return f"{100 * v:+.2f}%" if isinstance(v, (int, float)) else "-"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "problem",
        "set",
        "shape",
        "verdict",
        "judge ms",
        "do_bench ms",
        "judge/db-1",
        "ref judge ms",
        "ref do_bench ms",
        "ref judge/db-1",
        "undercut",
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (PROBLEMS.index(r["problem"]), SETS.index(r["set"]), r["candidate"])):
        verdict = r.get("verdict") or ("error" if r.get("error") else r.get("skipped", "-"))
        name = (
            r["problem"]
            if r["candidate"] == f"{r['problem']}_cuda.py"
            else f"{r['problem']} ({r['candidate']})"
        )
        under = f"{r.get('undercut_batches', 0)}/{r.get('judge_n', '-')}" if "judge_n" in r else "-"
        if r.get("ref_undercut_batches"):
            under += f" ref {r['ref_undercut_batches']}/{r.get('judge_ref_n', '-')}"
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    r["set"],
                    r.get("shape", "-"),
                    verdict,
                    _ms(r.get("judge_ms")),
                    _ms(r.get("do_bench_ms")),
                    _pc(r.get("dev")),
                    _ms(r.get("judge_ref_ms")),
                    _ms(r.get("do_bench_ref_ms")),
                    _pc(r.get("ref_dev")),
                    under,
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and maximum of |judge/do_bench - 1|: candidates, references, and both together."""

    def stats(keys: tuple[str, ...]) -> dict[str, Any]:
        vals = [
            (abs(r[k]), f"{r['problem']}/{r['set']}" + ("/ref" if k == "ref_dev" else ""))
            for r in rows
            for k in keys
            if isinstance(r.get(k), (int, float))
        ]
        if not vals:
            return {"n": 0}
        worst = max(vals)
        return {
            "n": len(vals),
            "median_abs": statistics.median(v for v, _ in vals),
            "max_abs": worst[0],
            "max_at": worst[1],
        }

    return {"all": stats(("dev", "ref_dev")), "candidate": stats(("dev",)), "reference": stats(("ref_dev",))}


def summary_line(s: dict[str, Any]) -> str:
    def part(label: str, d: dict[str, Any]) -> str:
        if not d.get("n"):
            return f"{label}: none"
        return f"{label} median {100 * d['median_abs']:.2f}% max {100 * d['max_abs']:.2f}% ({d['max_at']}, n={d['n']})"

    return "|judge/do_bench - 1|: " + "; ".join(
        [part("all", s["all"]), part("candidate", s["candidate"]), part("reference", s["reference"])]
    )


def write_json(path: Path | None, rows: list[dict[str, Any]], env: dict[str, Any]) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps({"env": env, "rows": rows, "summary": summary(rows)}, indent=1, default=str)
        )
    except OSError as exc:
        print(f"cuda_trust_timer: cannot write {path}: {exc}", file=sys.stderr)


# -- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="NAME",
        help="problems to run (names, or comma-separated): " + ", ".join(PROBLEMS),
    )
    parser.add_argument("--sets", nargs="+", default=SETS, choices=SETS, help="shape sets (default both)")
    parser.add_argument(
        "--cap-mib", type=float, default=256.0, help="largest level1 input, MiB (default 256)"
    )
    parser.add_argument("--extra", action="store_true", help="also gelu_load_inline and matmul_tuned_cuda")
    parser.add_argument(
        "--timeout", type=float, default=90.0, help="evaluation timeout_s of one job (default 90)"
    )
    parser.add_argument("--warmup", type=int, default=50, help="do_bench warmup, ms (default 50)")
    parser.add_argument("--rep", type=int, default=300, help="do_bench rep, ms (default 300)")
    parser.add_argument(
        "--budget",
        type=float,
        default=330.0,
        help="start no new row after this many seconds (default 330; the session step allows 420)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows (rewritten after each row)")
    parser.add_argument("--plan", action="store_true", help="print the rows and shapes only (no GPU needed)")
    args = parser.parse_args(argv)
    if args.only:
        names = [n for item in args.only for n in item.split(",") if n]
        unknown = [n for n in names if n not in PROBLEMS]
        if unknown:
            parser.error(f"unknown problem(s) {', '.join(unknown)}; choose from {', '.join(PROBLEMS)}")
        args.only = names
    if args.cap_mib <= 0 or args.rep <= 0 or args.warmup < 0 or args.timeout <= 0:
        parser.error("--cap-mib, --rep and --timeout must be positive, --warmup not negative")
    return args


def planned(args: argparse.Namespace) -> list[tuple[str, str, Path]]:
    """(problem, set, candidate file) rows, small set first (so a cut-short run still has all of it)."""
    rows = []
    for which in [s for s in SETS if s in args.sets]:
        for name in PROBLEMS:
            if args.only and name not in args.only:
                continue
            files = [CANDIDATES / f"{name}_cuda.py"] + (
                [CANDIDATES / f for f in EXTRA.get(name, [])] if args.extra else []
            )
            rows += [(name, which, f) for f in files]
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    cap = int(args.cap_mib * 2**20)
    if not args.plan:
        why = require_cuda()
        if why is not None:
            print(f"cuda_trust_timer: cannot run: {why}", file=sys.stderr)
            if args.json is not None:
                with contextlib.suppress(OSError):
                    args.json.write_text(json.dumps({"error": why, "rows": []}))
            return 2
    level1 = _level1()
    env: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "cap_mib": args.cap_mib,
        "do_bench": {"warmup": args.warmup, "rep": args.rep},
    }
    if not args.plan:
        try:
            import torch
            import triton

            env.update(torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name())
        except Exception as exc:
            env["env_error"] = f"{type(exc).__name__}: {exc}"[:200]
    rows: list[dict[str, Any]] = []
    for name, which, path in planned(args):
        row: dict[str, Any] = {"problem": name, "set": which, "candidate": path.name}
        rows.append(row)
        t0 = time.perf_counter()
        try:
            if not path.exists():
                row["skipped"] = "no candidate file"
                continue
            shapes, problem = plan_shapes(name, which, cap, level1)
            row.update(
                shapes=shapes, shape=_shape_label(problem), input_mib=round(_input_bytes(problem) / 2**20, 1)
            )
            if args.plan:
                print(json.dumps(row), flush=True)
                continue
            if time.perf_counter() - started > args.budget:
                row["skipped"] = f"budget of {args.budget:.0f} s spent"
                print(json.dumps(row), flush=True)
                continue
            try:
                row.update(judge_row(problem, path, args.timeout))
            except Exception as exc:
                row["error"] = _first_line(f"evaluator: {type(exc).__name__}: {exc}")
                row["traceback"] = traceback.format_exc()[-2000:]
            try:
                row.update(bench_row(problem, path, args.warmup, args.rep))
            except Exception as exc:
                row["bench_error"] = _first_line(f"do_bench: {type(exc).__name__}: {exc}")
            row["dev"] = _dev(row.get("judge_ms"), row.get("do_bench_ms"))
            row["ref_dev"] = _dev(row.get("judge_ref_ms"), row.get("do_bench_ref_ms"))
        except Exception as exc:  # one problem's failure does not end the run
            row["error"] = _first_line(f"{type(exc).__name__}: {exc}")
            row["traceback"] = traceback.format_exc()[-2000:]
        finally:
            row["wall_s"] = round(time.perf_counter() - t0, 1)
        if not args.plan:
            print(json.dumps({k: v for k, v in row.items() if k not in ("traceback", "shapes")}), flush=True)
            write_json(args.json, rows, env)
    if args.plan:
        return 0
    env["wall_s"] = round(time.perf_counter() - started, 1)
    write_json(args.json, rows, env)
    print("\n" + table(rows))
    print(summary_line(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
