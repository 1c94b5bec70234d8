"""Host time per kernel launch through kfoundry's CUDA launcher, against PyTorch's own launches.

A small KernelBench problem (a few MB) runs for microseconds on the H200, so the host's launch path
decides its time. This launches an empty kernel with 16 pointer and 4 int arguments (about what a
fused Level-2 chain's kernel takes) many times and reports the median host microseconds per launch:

    python3 benchmarks/cuda_launch_overhead.py                       # this tree's launcher
    python3 benchmarks/cuda_launch_overhead.py --old /tmp/cuda_launch_old.py   # also an older copy, side by side
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

SOURCE = """
extern "C" __global__ void kf_empty(
    const float* a0, const float* a1, const float* a2, const float* a3, const float* a4, const float* a5,
    const float* a6, const float* a7, const float* a8, const float* a9, const float* a10, const float* a11,
    const float* a12, const float* a13, const float* a14, float* out, int n, int m, int k, int l) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = a0[0] + a14[0] + n + m + k + l;
}
"""


def _per_launch_us(launch: Any, repeats: int, rounds: int) -> float:
    """Median over ``rounds`` of the host time of ``repeats`` launches, per launch."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            launch()
        times.append((time.perf_counter() - t0) / repeats * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, help="an older cuda_launch.py to time beside this one")
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_launch_overhead: no CUDA device here", file=sys.stderr)
        return 2

    from kfoundry.plugins.backends import cuda_launch
    from kfoundry.plugins.backends.cuda_compile import compile_cuda

    major, minor = torch.cuda.get_device_capability()
    result = compile_cuda(SOURCE, arch=f"sm_{major}{minor}", compiler="nvrtc", defines=None, options=[])
    tensors = [torch.zeros(1024, device="cuda") for _ in range(16)]
    launch_args = (*tensors, 1024, 1, 2, 3)

    def kernel_from(module: Any) -> Any:
        program = module.LoadedProgram(result.cubin, module.PrimaryContext.get(0))
        return program.kernel("kf_empty", "kf_empty")

    rows: list[tuple[str, float]] = []
    launchers = {"kfoundry (this tree)": kernel_from(cuda_launch)}
    if args.old is not None:
        spec = importlib.util.spec_from_file_location("cuda_launch_old", args.old)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        launchers[f"kfoundry ({args.old.name})"] = kernel_from(old)
    for name, kernel in launchers.items():
        rows.append(
            (
                name,
                _per_launch_us(
                    lambda k=kernel: k(*launch_args, grid=(1,), block=(32,)), args.repeats, args.rounds
                ),
            )
        )
    for name, kernel in launchers.items():  # every launcher passed the arguments in their places
        tensors[15].zero_()
        tensors[14].fill_(0.5)
        kernel(*launch_args, grid=(1,), block=(32,))
        torch.cuda.synchronize()
        if float(tensors[15][0]) != 1030.5:
            print(
                f"cuda_launch_overhead: {name} launched wrongly (out {float(tensors[15][0])}, expected 1030.5)"
            )
            return 1
    x = tensors[0]
    rows.append(
        ("torch x.add_(1) (one ATen launch)", _per_launch_us(lambda: x.add_(1), args.repeats, args.rounds))
    )
    print(
        f"| launcher (16 pointers + 4 ints) | host us per launch, median of {args.rounds} x {args.repeats} |"
    )
    print("|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
