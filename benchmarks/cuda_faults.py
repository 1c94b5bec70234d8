"""GPU faults through the real evaluator: a planted illegal-address kernel, a planted endless kernel,
then a correct kernel, evaluated one after another by one Evaluator on the CUDA backend.

Expected: runtime_error (illegal address), timeout (the worker is killed at the time limit, its
CUDA context with it), correct (a fresh worker and context evaluate the next candidate normally).

    python benchmarks/cuda_faults.py [--timeout 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kfoundry.core.config import load_config
from kfoundry.core.evaluation import Evaluator
from kfoundry.core.models import Candidate
from kfoundry.core.problem import load_problem

ROOT = Path(__file__).resolve().parent.parent

_TEMPLATE = '''
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
extern "C" __global__ void add(const float* a, const float* b, float* c, int n, volatile int* spin) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    BODY
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        flag = torch.zeros(1, dtype=torch.int32, device=a.device)
        self.k.add(a, b, c, a.numel(), flag, grid=(cdiv(a.numel(), 256),), block=(256,))
        return c
'''

BODIES = {
    # A wild store 1 TiB past the output: the MMU faults, the context is poisoned.
    "illegal_address": "if (i < n) c[i] = a[i] + b[i]; if (i == 0) c[1ll << 38] = 1.0f;",
    # Waits for a flag nobody sets: the kernel never finishes.
    "endless": "while (spin[0] == 0) { } if (i < n) c[i] = a[i] + b[i];",
    "correct": "if (i < n) c[i] = a[i] + b[i];",
}
EXPECTED = {"illegal_address": "runtime_error", "endless": "timeout", "correct": "correct"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    config = load_config(
        data={
            "backend": {"name": "cuda"},
            "executor": {"name": "local"},
            "evaluation": {"timeout_s": args.timeout, "cache": False, "memory_limit_mb": None, "trials": 2},
        },
        validate_plugins=False,
    )
    problem = load_problem(ROOT / "examples/kernelbench/vector_add.py", {})
    rows = []
    with Evaluator(problem, config) as evaluator:
        for name in ("illegal_address", "endless", "correct", "illegal_address", "correct"):
            candidate = Candidate(source=_TEMPLATE.replace("BODY", BODIES[name]), language="cuda", label=name)
            started = time.perf_counter()
            record = evaluator.evaluate(candidate)
            rows.append(
                {
                    "candidate": name,
                    "outcome": record.outcome.value,
                    "expected": EXPECTED[name],
                    "ok": record.outcome.value == EXPECTED[name],
                    "wall_s": round(time.perf_counter() - started, 2),
                    "median_ms": record.timing.median_ms if record.timing else None,
                    "message": record.message.splitlines()[0][:150] if record.message else "",
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"\n{'candidate':16} {'outcome':14} {'expected':14} {'ok':4} {'wall s':>7}  message")
    for r in rows:
        print(
            f"{r['candidate']:16} {r['outcome']:14} {r['expected']:14} {str(r['ok']):4} {r['wall_s']:7.2f}  {r['message'][:70]}"
        )


if __name__ == "__main__":
    main()
