"""Does the order of the L2 flush and the spin before the start event explain the judge's tiny-shape gap to
do_bench? (issue 18)

For the honest CUDA examples at their problem files' own (tiny) shapes and at a GPU size, in this process:
the median of the CUDA backend's device timer with the flush right before the start event (as
``triton.testing.do_bench`` does; the default) and with the spin between them (the order before), beside
``do_bench``'s median, the three measured interleaved in rounds.

    python benchmarks/cuda_timer_order.py          # GPU machine, ~1 minute
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("gelu", {}),
    ("softmax", {}),
    ("rms_norm", {}),
    ("layer_norm", {}),
    ("matmul", {}),
    ("gelu", {"N": 1 << 26}),
    ("softmax", {"batch_size": 1024, "dim": 65536}),
]


def main() -> int:
    import torch
    import triton.testing

    from kfoundry import runtime
    from kfoundry.core.models import Candidate
    from kfoundry.core.problem import load_problem
    from kfoundry.plugins.backends.cuda import CudaBackend

    backend = CudaBackend()
    runtime.set_backend(backend)
    timers = {"flush last": backend.device_timer(flush_last=True), "spin last": backend.device_timer(False)}
    print(
        "| problem | shape | flush last ms | spin last ms | do_bench ms | flush last / db | spin last / db |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, shapes in CASES:
        problem = load_problem(ROOT / "examples/kernelbench" / f"{name}.py", shapes or None)
        path = ROOT / "examples/kernelbench/cuda" / f"{name}_cuda.py"
        model = problem.build_candidate(
            Candidate(source=path.read_text(), language="cuda"), runtime.load
        ).cuda()
        inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in problem.make_inputs(1, "cuda")]
        got: dict[str, list[float]] = {k: [] for k in (*timers, "do_bench")}
        with torch.no_grad():

            def call(m: Any = model, a: list[Any] = inputs) -> Any:
                return m(*a)

            for _ in range(5):  # interleaved rounds: drift hits all three alike
                for key, timer in timers.items():
                    assert timer is not None
                    got[key] += [timer(call) for _ in range(60)]
                got["do_bench"].append(
                    float(triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median"))
                )
        med = {k: statistics.median(v) for k, v in got.items()}
        db = med["do_bench"]
        print(
            f"| {name} | {dict(problem.shapes)} | {med['flush last']:.4f} | {med['spin last']:.4f} | {db:.4f} | "
            f"{med['flush last'] / db:.3f} | {med['spin last'] / db:.3f} |",
            flush=True,
        )
        del model, inputs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
