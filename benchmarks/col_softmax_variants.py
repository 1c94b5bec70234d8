"""Softmax over a middle dimension (``torch.softmax(x, dim=1)`` of a (B, R, C) tensor): kernel layouts
timed side by side with eager, torch.compile and a copy of the same bytes, one process.

    python benchmarks/col_softmax_variants.py            # (64, 4096, 4095): tests/data's softmax_dim1_3d
    python benchmarks/col_softmax_variants.py --shape 16 4096 4096

Variants (CuPy RawKernels, fp32, checked against torch.softmax at rtol = atol = 1e-5):
  col1d[U]      a thread per column (the generator's layout today), U loads in flight in both passes
  col2d[RS,U]   a 32-column x RS-row-slice block: each thread's online (max, sum) over every RS-th row,
                merged through shared memory, then the write pass over the same rows
Each row: ms (median of CUDA events), GB/s over the three passes (two reads and a write), share of the
measured copy's bandwidth over those passes, x eager, x torch.compile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernelbench_run import make_timer, time_ms  # noqa: E402

COL1D = r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
extern "C" __global__ void col1d(const float* __restrict__ x, float* __restrict__ y, int B, int R, int C) {
    const long long cols = (long long)B * C;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < cols; g += (long long)gridDim.x * blockDim.x) {
        const long long b = g / C, c = g % C;
        const float* xp = x + b * R * C + c;
        float* yp = y + b * R * C + c;
        float mx = -INFINITY, den = 0.0f;
        int q = 0;
        for (; q + U <= R; q += U) {
            float v[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) v[u] = xp[(long long)(q + u) * C];
            #pragma unroll
            for (int u = 0; u < U; ++u) { if (v[u] > mx) { den = den * expf(mx - v[u]) + 1.0f; mx = v[u]; } else den += expf(v[u] - mx); }
        }
        for (; q < R; ++q) { const float w = xp[(long long)q * C]; if (w > mx) { den = den * expf(mx - w) + 1.0f; mx = w; } else den += expf(w - mx); }
        const float r = 1.0f / den;
        q = 0;
        for (; q + U <= R; q += U) {
            float v[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) v[u] = xp[(long long)(q + u) * C];
            #pragma unroll
            for (int u = 0; u < U; ++u) yp[(long long)(q + u) * C] = expf(v[u] - mx) * r;
        }
        for (; q < R; ++q) yp[(long long)q * C] = expf(xp[(long long)q * C] - mx) * r;
    }
}
"""

COL2D = r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
extern "C" __global__ void col2d(const float* __restrict__ x, float* __restrict__ y, int B, int R, int C) {
    __shared__ float smx[RS][33], sden[RS][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * 32 + tx;
    const long long base = (long long)blockIdx.y * R * C + c;
    const float* xp = x + base;
    float* yp = y + base;
    float mx = -INFINITY, den = 0.0f;
    if (c < C) {
        int q = ty;
        for (; q + (U - 1) * RS < R; q += U * RS) {
            float v[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) v[u] = xp[(long long)(q + u * RS) * C];
            #pragma unroll
            for (int u = 0; u < U; ++u) { if (v[u] > mx) { den = den * expf(mx - v[u]) + 1.0f; mx = v[u]; } else den += expf(v[u] - mx); }
        }
        for (; q < R; q += RS) { const float w = xp[(long long)q * C]; if (w > mx) { den = den * expf(mx - w) + 1.0f; mx = w; } else den += expf(w - mx); }
    }
    smx[ty][tx] = mx; sden[ty][tx] = den;
    __syncthreads();
    float M = -INFINITY;
    #pragma unroll
    for (int k = 0; k < RS; ++k) M = fmaxf(M, smx[k][tx]);
    float D = 0.0f;
    #pragma unroll
    for (int k = 0; k < RS; ++k) D += smx[k][tx] == -INFINITY ? 0.0f : sden[k][tx] * expf(smx[k][tx] - M);
    const float r = 1.0f / D;
    if (c < C) {
        int q = ty;
        for (; q + (U - 1) * RS < R; q += U * RS) {
            float v[U];
            #pragma unroll
            for (int u = 0; u < U; ++u) v[u] = xp[(long long)(q + u * RS) * C];
            #pragma unroll
            for (int u = 0; u < U; ++u) yp[(long long)(q + u * RS) * C] = expf(v[u] - M) * r;
        }
        for (; q < R; q += RS) yp[(long long)q * C] = expf(xp[(long long)q * C] - M) * r;
    }
}
"""


def _time(fn: Any, budget_s: float) -> float:
    """Median ms of ``fn`` over about ``budget_s`` of calls: the table's own CUDA-event timer."""
    return time_ms(fn, make_timer(torch.device("cuda")), budget_s)


def main(argv: list[str] | None = None) -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", nargs=3, type=int, default=[64, 4096, 4095])
    ap.add_argument("--budget-s", type=float, default=0.3)
    args = ap.parse_args(argv)
    B, R, C = args.shape
    torch.manual_seed(0)
    x = torch.rand(B, R, C, device="cuda")
    y = torch.empty_like(x)
    ref = torch.softmax(x, dim=1)
    nbytes = 3 * x.numel() * 4
    copy_ms = _time(lambda: y.copy_(x), args.budget_s)
    copy_bw = 2 * x.numel() * 4 / copy_ms / 1e6
    eager = _time(lambda: torch.softmax(x, dim=1), args.budget_s)
    comp = torch.compile(lambda t: torch.softmax(t, dim=1))
    comp(x)
    compiled = _time(lambda: comp(x), args.budget_s)
    print(f"(B, R, C) = ({B}, {R}, {C}); copy {copy_ms:.3f} ms = {copy_bw:.0f} GB/s over read + write")
    print("| variant | ms | GB/s (3 passes) | share of copy | x eager | x compile | correct |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| eager | {eager:.3f} | {nbytes / eager / 1e6:.0f} | {nbytes / eager / 1e6 / copy_bw:.2f} | 1.00 | "
        f"{compiled / eager:.2f} | |"
    )
    print(
        f"| compile | {compiled:.3f} | {nbytes / compiled / 1e6:.0f} | "
        f"{nbytes / compiled / 1e6 / copy_bw:.2f} | {eager / compiled:.2f} | 1.00 | |"
    )
    xs, ys = cp.asarray(x), cp.asarray(y)
    runs: list[tuple[str, str, str, tuple[int, ...], tuple[int, ...]]] = []
    for u in (4, 8, 16):
        cols = B * C
        runs.append(
            (
                f"col1d[U={u}]",
                f"#define U {u}\n" + COL1D,
                "col1d",
                (min((cols + 255) // 256, 132 * 8),),
                (256,),
            )
        )
    for rs in (4, 8, 16):
        for u in (4, 8):
            src = f"#define RS {rs}\n#define U {u}\n" + COL2D
            runs.append((f"col2d[RS={rs},U={u}]", src, "col2d", ((C + 31) // 32, B), (32, rs)))
    for tag, src, name, grid, block in runs:
        try:
            kern = cp.RawKernel(src, name)
            args_k = (xs, ys, cp.int32(B), cp.int32(R), cp.int32(C))
            y.zero_()
            kern(grid, block, args_k)
            torch.cuda.synchronize()
            ok = torch.allclose(y, ref, rtol=1e-5, atol=1e-5)
            ms = _time(lambda k=kern, g=grid, b=block, a=args_k: k(g, b, a), args.budget_s)
        except Exception as exc:  # noqa: BLE001  (a variant that fails is reported, not fatal)
            print(f"| {tag} | failed: {str(exc).splitlines()[0][:80]} | | | | | |")
            continue
        print(
            f"| {tag} | {ms:.3f} | {nbytes / ms / 1e6:.0f} | {nbytes / ms / 1e6 / copy_bw:.2f} | "
            f"{eager / ms:.2f} | {compiled / ms:.2f} | {ok} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
