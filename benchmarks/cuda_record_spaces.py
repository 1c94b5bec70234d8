"""Record full tuning spaces of two CUDA kernels on a GPU, in Kernel Tuner's cache-file format.

Kernels: an fp32 matrix product with shared-memory tiles and register blocking (6 parameters), and a
row softmax (memory-bound; 6 parameters). Every configuration that passes the restrictions is
compiled (NVRTC, in a process pool), checked against PyTorch on fresh random inputs (output poisoned
with NaN first), and timed with CUDA events (warm-up, then repeats until a time budget; L2 is far
smaller than the data). Failures are recorded as Kernel Tuner names them: "CompilationFailedConfig"
(the compiler refused it, e.g. too much shared memory) and "RuntimeFailedConfig" (the launch was
refused, e.g. too many registers for the block, or the result was wrong).

    python benchmarks/cuda_record_spaces.py --out benchmarks/spaces            # on the GPU machine
    python benchmarks/cuda_record_spaces.py --only softmax --limit 20          # a quick try

Prints a table per kernel: configurations, failures, best/median/worst time, the best configuration.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MATMUL = r"""
extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN))
matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    constexpr int NT = (BM / TM) * (BN / TN);
    __shared__ float As[BK][BM + PAD];  // A tile, transposed: As[k][m]
    __shared__ float Bs[BK][BN + PAD];
    const int tx = threadIdx.x;
    const int tr = tx / (BN / TN), tc = tx % (BN / TN);
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    float ra[TM], rb[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int i = tx; i < BM * BK; i += NT) {
            const int r = i / BK, c = i % BK;
            As[c][r] = A[(size_t)(row0 + r) * K + k0 + c];
        }
        for (int i = tx; i < BK * BN; i += NT) {
            const int r = i / BN, c = i % BN;
            Bs[r][c] = B[(size_t)(k0 + r) * N + col0 + c];
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
#pragma unroll
            for (int i = 0; i < TM; ++i) ra[i] = As[kk][tr * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) rb[j] = Bs[kk][tc * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) C[(size_t)(row0 + tr * TM + i) * N + col0 + tc * TN + j] = acc[i][j];
}
"""

SOFTMAX = r"""
// One block per row of DIM floats. CACHE keeps the row in registers (one read of memory);
// otherwise ONLINE=1 reads twice (online max+sum, then write), ONLINE=0 three times.
#define NV (DIM / VEC)
#define PER ((NV + BLOCK - 1) / BLOCK)

__device__ __forceinline__ void ldv(const float* p, float* v) {
#if VEC == 4
    float4 t = *reinterpret_cast<const float4*>(p); v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
#elif VEC == 2
    float2 t = *reinterpret_cast<const float2*>(p); v[0] = t.x; v[1] = t.y;
#else
    v[0] = p[0];
#endif
}
__device__ __forceinline__ void stv(float* p, const float* v) {
#if VEC == 4
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
#elif VEC == 2
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
#else
    p[0] = v[0];
#endif
}

__device__ __forceinline__ void combine(float& m, float& s, float om, float os) {
    const float nm = fmaxf(m, om);
    s = (m == -INFINITY ? 0.0f : s * __expf(m - nm)) + (om == -INFINITY ? 0.0f : os * __expf(om - nm));
    m = nm;
}

// Block-wide reduction of (m, s) pairs; s ignored when SUM_ONLY is false and MAX_ONLY is used.
__device__ void block_reduce(float& m, float& s, int mode) {  // mode 0: max of m; 1: sum of s; 2: (m, s)
    __shared__ float sm[BLOCK], ss[BLOCK];
    const int t = threadIdx.x;
#if REDUCE == 1
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
        if (mode == 0) m = fmaxf(m, om); else if (mode == 1) s += os; else combine(m, s, om, os);
    }
    if ((t & 31) == 0) { sm[t >> 5] = m; ss[t >> 5] = s; }
    __syncthreads();
    if (t < 32) {
        m = t < BLOCK / 32 ? sm[t] : -INFINITY;
        s = t < BLOCK / 32 ? ss[t] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
            if (mode == 0) m = fmaxf(m, om); else if (mode == 1) s += os; else combine(m, s, om, os);
        }
        if (t == 0) { sm[0] = m; ss[0] = s; }
    }
    __syncthreads();
#else
    sm[t] = m; ss[t] = s;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if (t < w) {
            if (mode == 0) sm[t] = fmaxf(sm[t], sm[t + w]);
            else if (mode == 1) ss[t] += ss[t + w];
            else { float a = sm[t], b = ss[t]; combine(a, b, sm[t + w], ss[t + w]); sm[t] = a; ss[t] = b; }
        }
        __syncthreads();
    }
#endif
    m = sm[0]; s = ss[0];
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(BLOCK) softmax(const float* __restrict__ x, float* __restrict__ y) {
    const float* xr = x + (size_t)blockIdx.x * DIM;
    float* yr = y + (size_t)blockIdx.x * DIM;
    const int t = threadIdx.x;
    float m = -INFINITY, s = 0.0f, v[VEC];
#if CACHE
    float c[PER][VEC];
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        const int i = p * BLOCK + t;
        if (i < NV) ldv(xr + i * VEC, c[p]); else for (int e = 0; e < VEC; ++e) c[p][e] = -INFINITY;
    }
#if ONLINE
#pragma unroll
    for (int p = 0; p < PER; ++p)
#pragma unroll
        for (int e = 0; e < VEC; ++e) combine(m, s, c[p][e], 1.0f);
    block_reduce(m, s, 2);
#else
#pragma unroll
    for (int p = 0; p < PER; ++p)
#pragma unroll
        for (int e = 0; e < VEC; ++e) m = fmaxf(m, c[p][e]);
    block_reduce(m, s, 0);
#pragma unroll
    for (int p = 0; p < PER; ++p)
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += __expf(c[p][e] - m);
    block_reduce(m, s, 1);
#endif
    const float inv = 1.0f / s;
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        const int i = p * BLOCK + t;
        if (i < NV) {
            for (int e = 0; e < VEC; ++e) v[e] = __expf(c[p][e] - m) * inv;
            stv(yr + i * VEC, v);
        }
    }
#else
#if ONLINE
#pragma unroll UNROLL
    for (int i = t; i < NV; i += BLOCK) {
        ldv(xr + i * VEC, v);
        for (int e = 0; e < VEC; ++e) combine(m, s, v[e], 1.0f);
    }
    block_reduce(m, s, 2);
#else
#pragma unroll UNROLL
    for (int i = t; i < NV; i += BLOCK) {
        ldv(xr + i * VEC, v);
        for (int e = 0; e < VEC; ++e) m = fmaxf(m, v[e]);
    }
    block_reduce(m, s, 0);
#pragma unroll UNROLL
    for (int i = t; i < NV; i += BLOCK) {
        ldv(xr + i * VEC, v);
        for (int e = 0; e < VEC; ++e) s += __expf(v[e] - m);
    }
    block_reduce(m, s, 1);
#endif
    const float inv = 1.0f / s;
#pragma unroll UNROLL
    for (int i = t; i < NV; i += BLOCK) {
        ldv(xr + i * VEC, v);
        for (int e = 0; e < VEC; ++e) v[e] = __expf(v[e] - m) * inv;
        stv(yr + i * VEC, v);
    }
#endif
}
"""


@dataclass
class Space:
    """A kernel, its tunable parameters, restrictions, and how to run and check it."""

    kernel_name: str
    source: str
    tune_params: dict[str, list[int]]
    restrict: Callable[[dict[str, int]], bool]
    problem_size: list[int]
    fixed_defines: dict[str, int]


def matmul_space(n: int) -> Space:
    def ok(p: dict[str, int]) -> bool:
        threads = (p["BM"] // p["TM"]) * (p["BN"] // p["TN"])
        return 32 <= threads <= 1024

    return Space(
        "matmul",
        MATMUL,
        {
            "BM": [32, 64, 128],
            "BN": [32, 64, 128],
            "BK": [8, 16, 32, 64],
            "TM": [1, 2, 4, 8],
            "TN": [1, 2, 4, 8],
            "PAD": [0, 1],
        },
        ok,
        [n, n, n],
        {},
    )


def softmax_space(rows: int, dim: int) -> Space:
    return Space(
        "softmax",
        SOFTMAX,
        {
            "BLOCK": [64, 128, 256, 512, 1024],
            "VEC": [1, 2, 4],
            "CACHE": [0, 1],
            "ONLINE": [0, 1],
            "UNROLL": [1, 2, 4, 8],
            "REDUCE": [0, 1],
        },
        lambda p: True,
        [rows, dim],
        {"DIM": dim},
    )


def configs(space: Space) -> list[dict[str, int]]:
    keys = list(space.tune_params)
    out = []
    for values in itertools.product(*(space.tune_params[k] for k in keys)):
        p = dict(zip(keys, values, strict=True))
        if space.restrict(p):
            out.append(p)
    return out


def _compile(args: tuple[str, dict[str, int], str]) -> tuple[Any, str, float]:
    """Compile one configuration in a worker process: (CompileResult or None, error, seconds)."""
    from kfoundry.core.backend import CompileFailed
    from kfoundry.plugins.backends.cuda_compile import compile_cuda

    source, defines, arch = args
    started = time.perf_counter()
    try:
        return (
            compile_cuda(source, arch=arch, compiler="nvrtc", defines=defines),
            "",
            time.perf_counter() - started,
        )
    except CompileFailed as exc:
        return None, str(exc), time.perf_counter() - started


def event_times(
    run: Callable[[], None], budget_s: float, min_runs: int = 5, max_runs: int = 50
) -> list[float]:
    """Per-run milliseconds with CUDA events: 3 warm-ups, then repeats until the budget."""
    import torch

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times: list[float] = []
    spent = 0.0
    while len(times) < min_runs or (spent < budget_s * 1e3 and len(times) < max_runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        spent += times[-1]
    return times


def record(space: Space, out_dir: Path, limit: int | None, workers: int, budget_s: float) -> dict[str, Any]:
    import torch

    from kfoundry.plugins.backends.cuda import CudaBackend
    from kfoundry.plugins.backends.cuda_launch import CudaLaunchError, is_sticky_error

    backend = CudaBackend()
    device = backend.select_device(0)
    arch = backend.target_arch(space.source)
    todo = configs(space)[:limit]
    torch.manual_seed(0)
    if space.kernel_name == "matmul":
        n = space.problem_size[0]
        a, b = torch.rand(n, n, device="cuda") - 0.5, torch.rand(n, n, device="cuda") - 0.5
        out = torch.empty(n, n, device="cuda")
        ref = torch.mm(a.double(), b.double()).float()

        def launcher(mod: Any, p: dict[str, int]) -> Callable[[], None]:
            threads = (p["BM"] // p["TM"]) * (p["BN"] // p["TN"])
            return lambda: mod.matmul(a, b, out, n, n, n, grid=(n // p["BN"], n // p["BM"]), block=(threads,))
    else:
        rows, dim = space.problem_size
        x = torch.randn(rows, dim, device="cuda") * 3
        out = torch.empty_like(x)
        ref = torch.softmax(x.double(), dim=1).float()

        def launcher(mod: Any, p: dict[str, int]) -> Callable[[], None]:
            return lambda: mod.softmax(x, out, grid=(rows,), block=(p["BLOCK"],))

    keys = list(space.tune_params)
    cache: dict[str, Any] = {}
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = [(space.source, {**space.fixed_defines, **p}, arch) for p in todo]
        for p, (result, error, compile_s) in zip(todo, pool.map(_compile, jobs, chunksize=4), strict=True):
            key = ",".join(str(p[k]) for k in keys)
            entry: dict[str, Any] = {
                **p,
                "compile_time": round(compile_s * 1e3, 3),
                "framework_time": 0.0,
                "strategy_time": 0.0,
            }
            if result is None:
                entry.update(time="CompilationFailedConfig", error=error.splitlines()[0][:200])
                cache[key] = entry
                continue
            entry["resources"] = result.resources.get(space.kernel_name, {})
            t0 = time.perf_counter()
            try:
                mod = backend.load_compiled(result)
                run = launcher(mod, p)
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                err = float((out - ref).norm() / ref.norm())
                entry["verification_time"] = round((time.perf_counter() - t0) * 1e3, 3)
                entry["rel_error"] = err
                if not err < 1e-4:  # NaN (unwritten output) fails too
                    entry.update(time="RuntimeFailedConfig", error=f"wrong result: relative error {err:.3g}")
                    cache[key] = entry
                    continue
                t1 = time.perf_counter()
                times = event_times(run, budget_s)
                entry.update(
                    time=statistics.mean(times),
                    times=[round(t, 5) for t in times],
                    median=statistics.median(times),
                    benchmark_time=round((time.perf_counter() - t1) * 1e3, 3),
                )
            except CudaLaunchError as exc:
                entry.update(time="RuntimeFailedConfig", error=str(exc)[:200])
            except RuntimeError as exc:
                if is_sticky_error(exc):
                    raise
                entry.update(time="RuntimeFailedConfig", error=str(exc)[:200])
            cache[key] = entry
    data = {
        "device_name": device.name,
        "kernel_name": space.kernel_name,
        "problem_size": space.problem_size,
        "tune_params_keys": keys,
        "tune_params": space.tune_params,
        "objective": "time",
        "objective_higher_is_better": False,
        "recorded_with": f"kfoundry benchmarks/cuda_record_spaces.py, {backend.toolchain_version()}, arch {arch}",
        "cache": cache,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = "".join(ch for ch in device.name.lower().split()[-1] if ch.isalnum())
    path = out_dir / f"cuda_{space.kernel_name}_{slug}.json"
    path.write_text(json.dumps(data, indent=1))
    valid = {k: e for k, e in cache.items() if isinstance(e["time"], float)}
    times = sorted(e["time"] for e in valid.values())
    best_key = min(valid, key=lambda k: valid[k]["time"]) if valid else None
    return {
        "kernel": space.kernel_name,
        "file": str(path),
        "configs": len(cache),
        "compile_failed": sum(e["time"] == "CompilationFailedConfig" for e in cache.values()),
        "runtime_failed": sum(e["time"] == "RuntimeFailedConfig" for e in cache.values()),
        "best_ms": times[0] if times else None,
        "median_ms": statistics.median(times) if times else None,
        "worst_ms": times[-1] if times else None,
        "within_5pct": sum(t <= times[0] * 1.05 for t in times) if times else 0,
        "best": best_key,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/spaces", type=Path)
    parser.add_argument("--only", choices=["matmul", "softmax"], default=None)
    parser.add_argument("--limit", type=int, default=None, help="record only the first N configurations")
    parser.add_argument("--n", type=int, default=4096, help="matmul size (M = N = K)")
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=16384)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--budget", type=float, default=0.03, help="seconds of timed runs per configuration")
    args = parser.parse_args()
    spaces = [softmax_space(args.rows, args.dim), matmul_space(args.n)]
    rows = []
    for space in spaces:
        if args.only in (None, space.kernel_name):
            rows.append(record(space, args.out, args.limit, args.workers, args.budget))
            print(json.dumps(rows[-1]), flush=True)
    print(
        f"\n{'kernel':8} {'configs':>7} {'cfail':>5} {'rfail':>5} {'best ms':>9} {'median':>9} {'worst':>9} {'<=5%':>5}  best config"
    )
    for r in rows:
        fmt = lambda v: f"{v:9.4f}" if v is not None else f"{'-':>9}"  # noqa: E731
        print(
            f"{r['kernel']:8} {r['configs']:7d} {r['compile_failed']:5d} {r['runtime_failed']:5d} "
            f"{fmt(r['best_ms'])} {fmt(r['median_ms'])} {fmt(r['worst_ms'])} {r['within_5pct']:5d}  {r['best']}"
        )


if __name__ == "__main__":
    main()
