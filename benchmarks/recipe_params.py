"""Time one offline recipe of our KernelBench problems at several template parameter settings, side by side
with eager and torch.compile, one process.

    python benchmarks/recipe_params.py level2/conv3d_mish_tanh.py graph/fused_coop CM=2,4 CN=8,16
    python benchmarks/recipe_params.py level1/conv1d.py,level2/conv2d_mish_mish.py graph/fused_coop CN=8,16

Problems are keys under tests/data/kernelbench (comma-separated); each ``NAME=v1,v2`` is a parameter's
values, and every combination is timed (the recipe's defaults fill the rest; the defaults themselves are
the first row). Each setting is checked against eager (rtol = atol = 1e-3, benchmarks/kernelbench.py's
fp32 tolerance) before it is timed; a wrong or failing one is reported, not timed. Times are medians of
CUDA events (TF32 off).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernelbench_run import RTOL, make_timer, time_ms  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "kernelbench"


def _time(fn: Any, budget_s: float) -> float:
    """Median ms of ``fn`` over about ``budget_s`` of calls: the table's own CUDA-event timer."""
    return time_ms(fn, make_timer(torch.device("cuda")), budget_s)


def _grid(specs: list[str]) -> list[dict[str, int]]:
    """Every combination of ``NAME=v1,v2`` specs, as parameter dicts (the empty dict first: defaults)."""
    names, values = [], []
    for spec in specs:
        name, _, vals = spec.partition("=")
        if not vals:
            raise SystemExit(f"recipe_params: {spec!r}: expected NAME=v1,v2")
        names.append(name)
        values.append([int(v) for v in vals.split(",")])
    return [{}] + [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", help="keys under tests/data/kernelbench, comma-separated")
    ap.add_argument("recipe")
    ap.add_argument("params", nargs="*", help="NAME=v1,v2 ...")
    ap.add_argument("--budget-s", type=float, default=0.3)
    ap.add_argument("--no-compile", action="store_true")
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
    settings = _grid(args.params)
    print("| problem | setting | ms | x eager | x compile | correct |")
    print("|---|---|---|---|---|---|")
    for key in args.problems.split(","):
        problem = load_problem(DATA / key, {})
        torch.manual_seed(1)
        inputs = problem.make_inputs(1, torch.device("cuda"))
        ref = problem.make_reference().cuda()
        with torch.no_grad():
            expected = ref(*inputs)
            eager = _time(lambda r=ref, a=inputs: r(*a), args.budget_s)
            compiled = float("nan")
            if not args.no_compile:
                comp = torch.compile(ref)
                comp(*inputs)
                compiled = _time(lambda c=comp, a=inputs: c(*a), args.budget_s)
        print(f"| {key} | eager | {eager:.3f} | 1.00 | {compiled / eager:.2f} | |")
        recipes = {r.name: r for r in gen.recipes(problem.summary(), "cuda")}
        if args.recipe not in recipes:
            print(f"| {key} | {args.recipe}: not offered ({', '.join(recipes)}) | | | | |")
            continue
        recipe = recipes[args.recipe]
        for params in settings:
            tag = ",".join(f"{k}={v}" for k, v in params.items()) or f"defaults {recipe.defaults}"
            try:
                ns: dict[str, Any] = {
                    "PARAMS": {**recipe.defaults, **params},
                    "__name__": "kf_c",
                    "load": load,
                }
                exec(compile(recipe.render(), recipe.name, "exec"), ns)
                model = ns["ModelNew"](*problem.make_init_inputs()).cuda()
                with torch.no_grad():
                    got = model(*inputs)
                    torch.cuda.synchronize()
                    ok = bool(torch.allclose(got.float(), expected.float(), rtol=RTOL, atol=RTOL))
                    ms = _time(lambda m=model, a=inputs: m(*a), args.budget_s) if ok else float("nan")
            except Exception as exc:  # noqa: BLE001  (a setting that fails is reported, not fatal)
                print(
                    f"| {key} | {tag} | failed: {str(exc).splitlines()[0][:90] if str(exc) else type(exc)} | | | |"
                )
                continue
            print(f"| {key} | {tag} | {ms:.3f} | {eager / ms:.2f} | {compiled / ms:.2f} | {ok} |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
