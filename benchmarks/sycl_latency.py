"""SYCL backend on this machine: compile latency per kernel (fresh source, then a JIT-cache hit) and a
vector add next to torch, side by side in one run.

    python benchmarks/sycl_latency.py                 # 5 fresh compiles, vector add of 2^20 and 2^24 floats
    python benchmarks/sycl_latency.py --compiles 10 --repeats 50

Needs the ``sycl`` extra (``pip install -e '.[sycl]'``) and g++. Prints medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kfoundry.plugins.backends.sycl import SyclBackend  # noqa: E402

ADD = r"""
#include <sycl/sycl.hpp>
namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void add(const float* a, const float* b, float* c, int n) {
    size_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
    if (i < (size_t)n) c[i] = a[i] + b[i] * SALT;
}
"""


def _median_ms(fn: object, repeats: int, sync: object) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        sync()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _vector_add_ms(module: Any, backend: SyclBackend, n: int, repeats: int) -> tuple[float, float]:
    """(SYCL kernel, torch) median ms for c = a + b over ``n`` floats; the kernel's result is checked."""
    a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
    kernel_ms = _median_ms(
        lambda: module.add(a, b, c, n, grid=(n // 256,), block=(256,)), repeats, backend.synchronize
    )
    torch.testing.assert_close(c, a + b)
    return kernel_ms, _median_ms(lambda: torch.add(a, b, out=c), repeats, lambda: None)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--compiles", type=int, default=5, help="fresh sources to compile")
    parser.add_argument("--repeats", type=int, default=30, help="launches timed per size")
    args = parser.parse_args()
    backend = SyclBackend()
    caps = backend.capabilities()
    if not caps.can_run:
        sys.exit(f"sycl backend unavailable: {caps.reason}")
    device = backend.select_device(None)
    cold = []
    for i in range(args.compiles):  # a distinct define each time: no JIT-cache hit
        cold.append(
            backend.load(ADD, defines={"SALT": f"{1 + (time.time_ns() % 10**6) * 1e-12 + i}f"}).compile_time_s
        )
    module = backend.load(ADD, defines={"SALT": "1.0f"})
    cached = backend.load(ADD, defines={"SALT": "1.0f"}).compile_time_s

    table = Table(title=f"SYCL on {device.name} ({backend.toolchain_version()})")
    table.add_column("what")
    table.add_column("median", justify="right")
    table.add_row(f"compile, fresh source ({args.compiles})", f"{statistics.median(cold):.2f} s")
    table.add_row("compile, same source again (JIT cache)", f"{cached:.2f} s")
    for n in (1 << 20, 1 << 24):
        kernel_ms, torch_ms = _vector_add_ms(module, backend, n, args.repeats)
        table.add_row(
            f"vector add 2^{n.bit_length() - 1} floats: SYCL / torch", f"{kernel_ms:.3f} / {torch_ms:.3f} ms"
        )
    Console().print(table)


if __name__ == "__main__":
    main()
