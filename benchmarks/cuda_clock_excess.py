"""Where does an honest CUDA call cost more on the host than its events say? (issue 18 diagnostics)

For a few example candidates (and a trusted no-op forward), in this process: each call through the
CUDA backend's device timer (sync, L2 flush, spin, start event, call, end event, sync), the host's
wall time of the timed call against its events. Prints the median excess per candidate and shape.

    python benchmarks/cuda_clock_excess.py          # GPU machine, ~1 minute
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("gelu", {"N": 1 << 26}),
    ("rms_norm", {"batch_size": 64, "features": 4096}),
    ("rms_norm", {"batch_size": 4096, "features": 16384}),
    ("softmax", {"batch_size": 1024, "dim": 65536}),
    ("layer_norm", {"batch_size": 16, "features": 4194304}),
    ("softmax", {"batch_size": 64, "dim": 4096}),
]


def _excess(timer: Any, call: Any, n: int = 150) -> tuple[float, float]:
    host, events = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        ev = timer(call)
        host.append((time.perf_counter() - t0) * 1e3)
        events.append(ev)
    return statistics.median(h - e for h, e in zip(host, events, strict=True)), statistics.median(events)


def main() -> int:
    import torch

    from kfoundry import runtime
    from kfoundry.core.models import Candidate
    from kfoundry.core.problem import load_problem
    from kfoundry.plugins.backends.cuda import CudaBackend

    backend = CudaBackend()
    runtime.set_backend(backend)
    timer = backend.device_timer()
    noop = backend.load('extern "C" __global__ void kf_noop(float* y) { if (y == 0) y[0] = 0.f; }').kf_noop
    print("| candidate | shape | events ms | host - events ms |\n|---|---|---|---|")
    out = torch.empty(1, device="cuda")
    ex, ev = _excess(timer, lambda: noop(out, grid=(1,), block=(32,)))
    print(f"| trusted no-op | - | {ev:.4f} | {ex:.4f} |")
    for name, shapes in CASES:
        problem = load_problem(ROOT / "examples/kernelbench" / f"{name}.py", shapes)
        path = ROOT / "examples/kernelbench/cuda" / f"{name}_cuda.py"
        model = problem.build_candidate(
            Candidate(source=path.read_text(), language="cuda"), runtime.load
        ).cuda()
        inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in problem.make_inputs(1, "cuda")]
        with torch.no_grad():
            ex, ev = _excess(timer, lambda m=model, a=inputs: m(*a))
            print(f"| {name} | {shapes} | {ev:.4f} | {ex:.4f} |", flush=True)
            names = type(model).forward.__globals__
            if "_aligned" in names:  # the same candidate's other path (no cluster, no float4)
                names["_aligned"] = lambda *a: False
                ex, ev = _excess(timer, lambda m=model, a=inputs: m(*a))
                print(f"| {name} (other path) | {shapes} | {ev:.4f} | {ex:.4f} |", flush=True)
        del model, inputs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
