"""Time the offline generator's fp32 GEMM variants against cuBLAS (torch.matmul, TF32 off), one process.

    python benchmarks/h13mm_sgemm_variants.py                   # the H200: the KernelBench matmul shapes
                                                                # at defaults, then a sweep at 4096^3
    python benchmarks/h13mm_sgemm_variants.py --quick           # defaults only
    python benchmarks/h13mm_sgemm_variants.py --only square_matmul.py --async-sweep   # + sgemm_async's grid

Each row: recipe[params], ms (median of CUDA events), x cuBLAS, TFLOP/s and whether it matches
torch.matmul (rtol = atol = 1e-3 on fp32 outputs, as benchmarks/kernelbench.py checks; 1e-2 on
fp16/bf16 ones, as the judge does). fp16/bf16 problems time ``matmul/mma_tiles`` (tensor cores) against
torch.matmul in the same dtype (cuBLAS with tensor cores).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "kernelbench" / "level1"

#: Problem file, shape override (none: its own size), and whether to sweep the async kernel there.
PROBLEMS: list[tuple[str, dict[str, int | float], bool]] = [
    ("square_matmul.py", {}, True),
    ("square_matmul_fp16.py", {}, False),
    ("matmul_bf16.py", {}, False),
    ("matmul_irregular.py", {}, False),
    ("matmul_large_k.py", {}, False),
    ("tall_skinny_matmul.py", {}, False),
]

SWEEP = {"BK": [8, 16, 32], "STAGES": [2, 3, 4], "LAYOUT": [0, 1]}

#: ``matmul/sgemm_warp`` tile shapes at 4096^3: block BM x BN, warp WM x WN, thread TM x TN (MINB blocks/SM).
_W = {
    "128x256": {"BM": 128, "BN": 256, "WM": 64, "WN": 64, "TM": 16, "TN": 8, "BK": 16, "MINB": 1},
    "256x128": {"BM": 256, "BN": 128, "WM": 64, "WN": 64, "TM": 16, "TN": 8, "BK": 16, "MINB": 1},
    "128x256_t8x16": {"BM": 128, "BN": 256, "WM": 64, "WN": 64, "TM": 8, "TN": 16, "BK": 16, "MINB": 1},
    "128x128": {"BM": 128, "BN": 128, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "BK": 8, "MINB": 2},
    "128x128_t16x8": {"BM": 128, "BN": 128, "WM": 64, "WN": 64, "TM": 16, "TN": 8, "BK": 8, "MINB": 2},
}
WARP_SWEEP: list[dict[str, int]] = [
    *({**_W["128x256"], "SWZ": swz} for swz in (0, 4, 16)),
    {**_W["128x256"], "BK": 8},
    *({**_W[t], "SWZ": swz} for t in ("256x128", "128x256_t8x16") for swz in (0, 8)),
    {**_W["256x128"], "BK": 8},
    {**_W["128x128"], "SWZ": 16},
    {**_W["128x128_t16x8"], "SWZ": 0},
]


def _time(fn: Any, budget_s: float) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    reps = int(min(100, max(5, budget_s / max(time.perf_counter() - t0, 1e-6))))
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def _build(recipe: Any, params: dict[str, Any], problem: Any, load: Any) -> Any:
    ns: dict[str, Any] = {"PARAMS": {**recipe.defaults, **params}, "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), ns)
    return ns["ModelNew"](*problem.make_init_inputs()).cuda()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="defaults only, no sweep")
    ap.add_argument("--budget-s", type=float, default=0.1)
    ap.add_argument("--only", nargs="*", default=None, help="problem files to run (default: all)")
    ap.add_argument("--async-sweep", action="store_true", help="also sgemm_async's 20-variant grid")
    args = ap.parse_args(argv)

    from kfoundry.core.plugins import get_plugin
    from kfoundry.core.problem import load_problem
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator
    from kfoundry.runtime import load, set_backend

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    backend = get_plugin("backend", "cuda").build({})
    backend.require_device()
    set_backend(backend)
    gen = OfflineGenerator()
    print("| problem | recipe | ms | x cuBLAS | TFLOP/s | correct |")
    print("|---|---|---|---|---|---|")
    passes = [(n, sh, False) for n, sh, _ in PROBLEMS]  # every problem at defaults first, then the sweeps
    passes += [] if args.quick else [(n, sh, True) for n, sh, sw in PROBLEMS if sw]
    for name, shape, sweep in passes:
        path = DATA / name
        if not path.exists() or (args.only is not None and name not in args.only):
            continue
        problem = load_problem(path, shape)
        torch.manual_seed(0)
        inputs = problem.make_inputs(1, torch.device("cuda"))
        ref = problem.make_reference().cuda()
        with torch.no_grad():
            expected = ref(*inputs)
            eager = _time(functools.partial(ref, *inputs), args.budget_s)
        a, b = inputs
        flops = 2 * a.shape[0] * a.shape[1] * b.shape[-1]
        print(f"| {name} | cuBLAS (torch, TF32 off) | {eager:.4f} | 1.00 | {flops / eager / 1e9:.1f} | |")
        recipes = {r.name: r for r in gen.recipes(problem.summary(), "cuda")}
        runs: list[tuple[str, dict[str, Any]]] = (
            [] if sweep else [(n, {}) for n in recipes if n.startswith(("matmul/sgemm", "matmul/mma"))]
        )
        if sweep and "matmul/sgemm_warp" in recipes:
            runs += [("matmul/sgemm_warp", params) for params in WARP_SWEEP]
        if sweep and args.async_sweep and "matmul/sgemm_async" in recipes:
            for combo in itertools.product(*SWEEP.values()):
                params = dict(zip(SWEEP, combo, strict=True))
                params["MINB"] = 1 if params["BK"] == 32 else 2
                runs.append(("matmul/sgemm_async", params))
            runs.append(("matmul/sgemm_async", {"SWZ": 0}))
            runs.append(("matmul/sgemm_async", {"MINB": 1}))
        if not sweep and not args.quick and "matmul/mma_tiles" in recipes:
            runs += [("matmul/mma_tiles", {"STAGES": st, "SWZ": sw}) for st in (2, 4) for sw in (0, 8)]
            runs.append(("matmul/mma_tiles", {"LDSM": 0}))
        for rname, params in runs:
            tag = rname + (f"[{','.join(f'{k}={v}' for k, v in params.items())}]" if params else "")
            try:
                model = _build(recipes[rname], params, problem, load)
                with torch.no_grad():
                    got = model(*inputs)
                    torch.cuda.synchronize()
                    tol = 1e-2 if expected.dtype in (torch.float16, torch.bfloat16) else 1e-3
                    ok = (got.shape, got.dtype) == (expected.shape, expected.dtype) and torch.allclose(
                        got.float(), expected.float(), rtol=tol, atol=tol
                    )
                    ms = _time(functools.partial(model, *inputs), args.budget_s)
            except Exception as exc:  # noqa: BLE001 - one variant's failure loses only its row
                print(f"| {name} | {tag} | {type(exc).__name__}: {str(exc)[:100]} | | | |", flush=True)
                continue
            err = "yes" if ok else f"NO (max err {(got.float() - expected.float()).abs().max().item():.3g})"
            print(
                f"| {name} | {tag} | {ms:.4f} | {eager / ms:.2f} | {flops / ms / 1e9:.1f} | {err} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
