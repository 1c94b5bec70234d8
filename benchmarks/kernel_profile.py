"""Where a recipe's time goes: each kernel of one offline recipe (or eager / torch.compile) on one of our
KernelBench problems, from torch.profiler's device trace, as a table (kernel, calls, ms per call, share).

    python benchmarks/kernel_profile.py level2/conv_transpose2d_maxpool_hardtanh_mean_tanh.py \
        --recipe graph/fused_coop --recipe eager --recipe compile

The recipes run at their defaults on the inputs of ``benchmarks/kernelbench.py`` (seed 1); each is
checked against eager first (a wrong one is reported, not profiled).

With ``--ncu`` the script only marks one call of each recipe for Nsight Compute (CUDA profiler start/stop
around it, an NVTX range named "problem recipe"); run it under ncu:

    ncu --profile-from-start off --nvtx --clock-control none --section SpeedOfLight \
        --section WarpStateStats -o prof python benchmarks/kernel_profile.py --ncu \
        level1/l2_norm.py:graph/fused_coop level1/softmax_rows.py:softmax/cluster_stream

A problem written ``key:recipe`` runs only that recipe (the ``--recipe`` list applies to the others).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernelbench import DATA  # noqa: E402
from kernelbench_cache import prepare  # noqa: E402
from kernelbench_run import close, expected_output  # noqa: E402

#: ``--param NAME=VALUE`` overrides of every recipe's defaults
PARAM_OVERRIDES: dict[str, int] = {}


def _callable(name: str, problem: Any, ref: Any, device: Any, load: Any) -> Any:
    """The callable for ``name``: eager, compile or an offline recipe at its defaults."""
    import torch

    from kfoundry.plugins.llms.offline.generator import OfflineGenerator

    if name == "eager":
        return ref
    if name == "compile":
        return torch.compile(ref)
    recipes = {r.name: r for r in OfflineGenerator().recipes(problem.summary(), "cuda")}
    if name not in recipes:
        raise SystemExit(f"kernel_profile: no recipe {name!r} here (have: {', '.join(sorted(recipes))})")
    recipe = recipes[name]
    params = {**recipe.defaults, **PARAM_OVERRIDES}
    namespace: dict[str, Any] = {"PARAMS": params, "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    return namespace["ModelNew"](*problem.make_init_inputs()).to(device)


def profile(fn: Any, inputs: list[Any], calls: int) -> list[tuple[str, int, float]]:
    """(kernel name, launches per call, device ms per call) of ``fn(*inputs)``, most time first."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from kfoundry.runtime import synchronize

    with torch.no_grad():
        for _ in range(2):
            fn(*inputs)
        synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*inputs)
            synchronize()
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time / 1e3
            count[ev.name] += 1
    rows = [(n, count[n] // calls, total[n] / calls) for n in total]
    return sorted(rows, key=lambda r: -r[2])


def mark_for_ncu(fn: Any, inputs: list[Any], label: str) -> None:
    """Two warm calls of ``fn``, then one inside CUDA profiler start/stop and an NVTX range ``label``."""
    import torch

    from kfoundry.runtime import synchronize

    with torch.no_grad():
        for _ in range(2):
            fn(*inputs)
        synchronize()
        torch.cuda.profiler.start()
        # a torch built without NVTX: the kernels' order still tells which is which
        with contextlib.suppress(RuntimeError, AttributeError):
            torch.cuda.nvtx.range_push(label)
        fn(*inputs)
        synchronize()
        with contextlib.suppress(RuntimeError, AttributeError):
            torch.cuda.nvtx.range_pop()
        torch.cuda.profiler.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="+", help="keys under tests/data/kernelbench, e.g. level1/gelu.py")
    ap.add_argument("--recipe", action="append", default=[], help="a recipe name, eager or compile (repeat)")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--ncu", action="store_true", help="mark one call of each for Nsight Compute instead")
    ap.add_argument("--param", action="append", default=[], help="NAME=INT: a template parameter (repeat)")
    ap.add_argument(
        "--small", action="store_true", help="the shapes of tests/data/kernelbench/small_shapes.json"
    )
    args = ap.parse_args(argv)
    for spec in args.param:
        name, _, value = spec.partition("=")
        PARAM_OVERRIDES[name] = int(value)
    import torch

    from kfoundry.core.problem import load_problem
    from kfoundry.runtime import load

    small = json.loads((DATA / "small_shapes.json").read_text()) if args.small else {}
    if not torch.cuda.is_available():
        print(
            "kernel_profile: needs a CUDA device (the profile is torch.profiler's CUDA trace)",
            file=sys.stderr,
        )
        return 2
    _, device, _ = prepare("cuda", Path(tempfile.mkdtemp(prefix="kf-profile-")))
    for entry in args.problems:
        key, _, only = entry.partition(":")
        problem = load_problem(DATA / key, small.get(key, {}))
        torch.manual_seed(0)
        ref = problem.make_reference().to(device)
        inputs = problem.make_inputs(1, device)
        with torch.no_grad():
            expected, inputs = expected_output(ref, problem, inputs, 1, device)
        for name in [only] if only else args.recipe or ["eager"]:
            fn = _callable(name, problem, ref, device, load)
            with torch.no_grad():
                ok, err = close(fn(*inputs), expected)
            if not ok:
                print(f"## {key} {name}: differs from eager (max error {err:.3g}); not profiled", flush=True)
                continue
            if args.ncu:
                mark_for_ncu(fn, inputs, f"{key} {name}")
                print(f"## {key} {name}: marked for ncu", flush=True)
                continue
            rows = profile(fn, inputs, args.calls)
            whole = sum(ms for _, _, ms in rows) or float("nan")
            print(f"## {key} {name}: {whole:.3f} ms of kernels per call", flush=True)
            print("| kernel | launches | ms | share |\n|---|---|---|---|")
            for kname, n, ms in rows[:12]:
                print(f"| {kname[:90]} | {n} | {ms:.3f} | {ms / whole:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
