"""Throughput of the pipeline: candidates per minute with 1 and 2 workers, generator calls per minute.

    python benchmarks/throughput.py [--candidates 8] [--no-ray] [--calls 8] [--delay 2]

Evaluation: ``--candidates`` distinct OpenCL kernels for ``vector_add`` (each its own source, so PoCL
compiles every one; a few correctness trials and a short timing phase: compile-bound), judged as one
batch by the :class:`Evaluator` through the local executor and (if installed) the Ray executor on a
local Ray instance, with 1 and 2 workers. The reference's timing and a warm-up batch (the fork
server's and Ray workers' start-up) are not counted. Generator calls: ``--calls`` requests of one
generation through an openai-provider ensemble against the loopback server of the tests
(``tests/llm_server.py``), which holds every reply ``--delay`` s, one at a time and with a
per-provider concurrency of 4. Prints one table; on a shared 2-core machine numbers are noisy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

#: A kernel with enough code that compiling it dominates a small problem's evaluation.
KERNEL = r'''
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
inline float mix_VARIANT(float x, int k) {
    float y = x;
    for (int r = 0; r < 4; ++r) { y = y * 1.0f + 0.0f * (float)(k + r); }
    return y;
}
__kernel void vector_add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = mix_VARIANT(a[i], i) + mix_VARIANT(b[i], i + VARIANT);
}
"""

BLOCK = PARAMS.get("BLOCK", 64)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC, defines=PARAMS)

    def forward(self, a, b):
        c = torch.empty_like(a)
        n = a.numel()
        self.k.vector_add(a, b, c, n, grid=(cdiv(n, BLOCK),), block=(BLOCK,))
        return c
'''


def candidates(n: int, salt: int) -> list[Any]:
    from kfoundry.core.models import Candidate

    return [
        Candidate(source=KERNEL.replace("VARIANT", str(salt * 1000 + i)), label=f"v{i}") for i in range(n)
    ]


def eval_config(out: str, executor: str, workers: int) -> Any:
    from kfoundry.core.config import load_config

    options: dict[str, Any] = {"workers": workers} if executor == "local" else {"cpus_per_job": 1.0}
    return load_config(
        data={
            "output_dir": out,
            "executor": {"name": executor, "options": options},
            "evaluation": {
                "cache": False,
                "trials": 2,
                "correctness_budget_s": 0.0,
                "target_time_s": 0.005,
                "warmup_s": 0.0,
                "min_repeats": 3,
                "max_repeats": 10,
                "rotate_bytes": 0,
                "timeout_s": 120,
            },
        },
        validate_plugins=False,
    )


def per_minute(executor: str, workers: int, n: int) -> tuple[float, int]:
    """Candidates per minute, and how many were correct."""
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem

    problem = load_problem(ROOT / "examples" / "kernelbench" / "vector_add.py", {"N": 4096})
    ray = None
    if executor == "ray":
        import ray

        ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        with (
            tempfile.TemporaryDirectory() as out,
            Evaluator(problem, eval_config(out, executor, workers)) as ev,
        ):
            ev.reference_timing()
            ev.evaluate_many(candidates(workers, salt=1))  # warm-up: the workers' start-up
            start = time.perf_counter()
            records = ev.evaluate_many(candidates(n, salt=2 + workers))
            wall = time.perf_counter() - start
    finally:
        if ray is not None:
            ray.shutdown()
    return n / wall * 60, sum(r.is_correct for r in records)


def calls_per_minute(calls: int, delay: float, concurrency: int) -> float:
    from llm_server import LLMServer, Reply, Slow, fenced, vecadd
    from test_concurrency_llm import ensemble, requests

    from kfoundry.core.loop import propose_together

    with LLMServer() as srv, tempfile.TemporaryDirectory() as out:
        srv.openai.responder = lambda body: Slow(delay, Reply(fenced(vecadd())))
        gen = ensemble(srv, Path(out), concurrency=concurrency)
        propose_together(gen, requests(1), limit=1)  # the SDK's start-up is not counted
        start = time.perf_counter()
        answers = propose_together(gen, requests(calls), limit=gen.concurrency)
        wall = time.perf_counter() - start
    assert all(isinstance(a, list) and a for a in answers), answers
    return calls / wall * 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray executor")
    args = parser.parse_args()
    rows: list[tuple[str, str, str, str]] = []
    executors = ["local"] + ([] if args.no_ray else ["ray"])
    for executor in executors:
        base = None
        for workers in (1, 2):
            rate, correct = per_minute(executor, workers, args.candidates)
            base = base or rate
            rows.append(
                (
                    f"evaluate ({executor})",
                    f"{workers} worker(s)",
                    f"{rate:.1f} candidates/min ({correct}/{args.candidates} correct)",
                    f"{rate / base:.2f}x",
                )
            )
    base = None
    for concurrency in (1, 4):
        rate = calls_per_minute(args.calls, args.delay, concurrency)
        base = base or rate
        rows.append(
            (
                "generator calls",
                f"concurrency {concurrency}",
                f"{rate:.1f} calls/min ({args.calls} calls, {args.delay:g} s each)",
                f"{rate / base:.2f}x",
            )
        )
    print("| stage | setting | throughput | vs first |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
