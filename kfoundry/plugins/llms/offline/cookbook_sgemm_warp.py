"""Warp-tiled fp32 GEMM for CUDA: ``matmul/sgemm_warp``.

FFMA only (TF32 never used). Template parameters: the block tile BM x BN, K in steps of BK, the warp tile
WM x WN and the thread tile TM x TN (NT = (BM / WM) * (BN / WN) * 32 threads, WM * WN = 32 * TM * TN).

- A warp's lanes are LR x LC = (WM / TM) x (WN / TN). A thread holds TM / 4 strips of 4 rows, LR * 4 rows
  apart, and TN / 4 strips of 4 columns, LC * 4 columns apart: its fragments are float4 shared reads, and a
  warp's read of one strip touches LR (A) or LC (B) consecutive float4s (at most 128 bytes, one wavefront).
- A is stored transposed, ``As[k][m]`` with stride BM + 4 (a warp's transposing 4-byte stores land in
  distinct banks for BK = 8, two ways for BK >= 16); B as ``Bs[k][n]``. Both tiles are double-buffered in
  dynamic shared memory: the next step's global loads (float4, LDG.128, where K and N are multiples of 4
  and the operands 16-byte aligned: kernel ``matmul``; 4-byte loads otherwise: ``matmul_u``) are held in
  registers while the current step multiplies, then stored into the other buffer; one barrier per step.
- Every load is predicated on M, N and K (zero fill past them): every shape runs one of the two kernels.
- ``nn.Linear``: the weight [N, K] is read in place by A's transposing loads (no transpose kernel).
- SWZ > 0: blocks run in groups of SWZ tile rows (A's rows stay in L2 across a group).
- SPLIT=1: where the output has fewer tiles than the SMs and K is long, K is split over grid z; each slice
  writes its partial tile to a workspace and ``matmul_sum`` adds the slices in order (deterministic).

Expected at 4096^3 on the H200 (132 SMs, fp32 FFMA peak ~67 TFLOP/s): cuBLAS reads ~51 TFLOP/s (2.7 ms);
a 128 x 128 x 8 tile with 64 x 64 warp tiles (128 threads, 16 x 8 per thread) is cuBLAS' own SIMT shape.
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec


def _kernel(spec: OpSpec, epilogue: str, epi_call: str) -> str:
    bias_p = "const float* __restrict__ bias, " if spec.bias else ""
    bias_a = "bias, " if spec.bias else ""
    epi_j = epi_call.format(v="v[j]", n="n + j")
    epi_v = epi_call.format(v="v", n="n")
    params = f"const float* __restrict__ A, const float* __restrict__ B, {bias_p}float* __restrict__ C, int M, int N, int K, int kc"
    args = f"A, B, {bias_a}C, M, N, K, kc"
    return f"""{epilogue}
#ifndef KF_SMEM_DECL
#define KF_SMEM_DECL extern __shared__ __align__(16) float kf_smem[];
#endif
#define BT {int(spec.linear)}
#define NT ((BM / WM) * (BN / WN) * 32)
#define LR (WM / TM)
#define LC (WN / TN)
#define KQ (BK / 4)
#define LA (BM * BK / 4 / NT)
#define LB (BN * BK / 4 / NT)
#define SA (BM + 4)
#define SB (BN + 4 * BT)
#if WM * WN != 32 * TM * TN || BM % WM || BN % WN || WM % TM || WN % TN || TM % 4 || TN % 4 || BK % 4
#error "sgemm_warp: inconsistent tile parameters"
#endif
#if LA < 1 || LB < 1 || (BM * BK / 4) % NT || (BN * BK / 4) % NT
#error "sgemm_warp: the threads do not divide the tiles' float4s"
#endif

// VEC: float4 global loads (K % 4 == 0, N % 4 == 0 unless BT, operands 16-byte aligned); 4-byte loads otherwise
template <bool VEC>
__device__ __forceinline__ void kf_sgemm_warp({params}) {{
    KF_SMEM_DECL
    float* As = kf_smem;                      // [2][BK][SA]: A transposed
    float* Bs = kf_smem + 2 * BK * SA;        // [2][BK][SB]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rb = (warp / (BN / WN)) * WM + (lane / LC) * 4;   // first row of the thread's strips
    const int cb = (warp % (BN / WN)) * WN + (lane % LC) * 4;   // first column
    int bx = blockIdx.x, by = blockIdx.y;
#if SWZ > 0
    {{
        const int gx = gridDim.x, gy = gridDim.y, pid = by * gx + bx, span = SWZ * gx;
        const int first = (pid / span) * SWZ, rows = min(gy - first, SWZ);
        by = first + (pid % span) % rows;
        bx = (pid % span) / rows;
    }}
#endif
    const int bm = by * BM, bn = bx * BN;
    const int kb = blockIdx.z * kc, ke = min(K, kb + kc);
    const int ntiles = (ke - kb + BK - 1) / BK;
    // the thread's global loads: A (and BT's B) as rows x float4 along K, B as rows of K x float4 along N
    const float* pa[LA];
    int ka[LA];
    bool ma[LA];
    #pragma unroll
    for (int i = 0; i < LA; ++i) {{
        const int e = tid + NT * i, r = e / KQ, q = (e % KQ) * 4, m = bm + r;
        ma[i] = m < M;
        ka[i] = kb + q;
        pa[i] = A + (size_t)(ma[i] ? m : 0) * K + kb + q;
    }}
    const float* pb[LB];
    int kbv[LB];
    bool nb[LB];
    #pragma unroll
    for (int i = 0; i < LB; ++i) {{
        const int e = tid + NT * i;
#if BT
        const int r = e / KQ, q = (e % KQ) * 4, n = bn + r;
        nb[i] = n < N;
        kbv[i] = kb + q;
        pb[i] = B + (size_t)(nb[i] ? n : 0) * K + kb + q;
#else
        const int r = e / (BN / 4), c = (e % (BN / 4)) * 4, n = bn + c;
        nb[i] = n < N;
        kbv[i] = kb + r;
        pb[i] = B + (size_t)min(kb + r, K - 1) * N + (nb[i] ? n : 0);
#endif
    }}
    float4 ga[LA], gb[LB];
    auto fetch = [&](int t) {{
        const int dk = t * BK;
        #pragma unroll
        for (int i = 0; i < LA; ++i) {{
            const int k = ka[i] + dk;
            if (VEC) {{
                ga[i] = ma[i] && k < ke ? __ldg(reinterpret_cast<const float4*>(pa[i] + dk)) : make_float4(0.f, 0.f, 0.f, 0.f);
            }} else {{
                const float* p = pa[i] + dk;
                ga[i].x = ma[i] && k < ke ? __ldg(p) : 0.0f;
                ga[i].y = ma[i] && k + 1 < ke ? __ldg(p + 1) : 0.0f;
                ga[i].z = ma[i] && k + 2 < ke ? __ldg(p + 2) : 0.0f;
                ga[i].w = ma[i] && k + 3 < ke ? __ldg(p + 3) : 0.0f;
            }}
        }}
        #pragma unroll
        for (int i = 0; i < LB; ++i) {{
            const int k = kbv[i] + dk;
#if BT
            if (VEC) {{
                gb[i] = nb[i] && k < ke ? __ldg(reinterpret_cast<const float4*>(pb[i] + dk)) : make_float4(0.f, 0.f, 0.f, 0.f);
            }} else {{
                const float* p = pb[i] + dk;
                gb[i].x = nb[i] && k < ke ? __ldg(p) : 0.0f;
                gb[i].y = nb[i] && k + 1 < ke ? __ldg(p + 1) : 0.0f;
                gb[i].z = nb[i] && k + 2 < ke ? __ldg(p + 2) : 0.0f;
                gb[i].w = nb[i] && k + 3 < ke ? __ldg(p + 3) : 0.0f;
            }}
#else
            const float* p = pb[i] + (size_t)dk * N;
            if (VEC) {{
                gb[i] = nb[i] && k < ke ? __ldg(reinterpret_cast<const float4*>(p)) : make_float4(0.f, 0.f, 0.f, 0.f);
            }} else {{
                const int n = bn + (((tid + NT * i) % (BN / 4)) * 4);
                gb[i].x = k < ke && n < N ? __ldg(p) : 0.0f;
                gb[i].y = k < ke && n + 1 < N ? __ldg(p + 1) : 0.0f;
                gb[i].z = k < ke && n + 2 < N ? __ldg(p + 2) : 0.0f;
                gb[i].w = k < ke && n + 3 < N ? __ldg(p + 3) : 0.0f;
            }}
#endif
        }}
    }};
    auto stash = [&](int s) {{
        float* as = As + s * (BK * SA);
        float* bs = Bs + s * (BK * SB);
        #pragma unroll
        for (int i = 0; i < LA; ++i) {{
            const int e = tid + NT * i, r = e / KQ, q = (e % KQ) * 4;
            as[(q + 0) * SA + r] = ga[i].x;
            as[(q + 1) * SA + r] = ga[i].y;
            as[(q + 2) * SA + r] = ga[i].z;
            as[(q + 3) * SA + r] = ga[i].w;
        }}
        #pragma unroll
        for (int i = 0; i < LB; ++i) {{
            const int e = tid + NT * i;
#if BT
            const int r = e / KQ, q = (e % KQ) * 4;
            bs[(q + 0) * SB + r] = gb[i].x;
            bs[(q + 1) * SB + r] = gb[i].y;
            bs[(q + 2) * SB + r] = gb[i].z;
            bs[(q + 3) * SB + r] = gb[i].w;
#else
            const int r = e / (BN / 4), c = (e % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(bs + r * SB + c) = gb[i];
#endif
        }}
    }};
    float acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    if (ntiles > 0) {{
        fetch(0);
        stash(0);
    }}
    __syncthreads();
    for (int t = 0; t < ntiles; ++t) {{
        const int cur = t & 1;
        const bool more = t + 1 < ntiles;
        if (more) fetch(t + 1);   // in flight during this step's FMAs
        const float* as = As + cur * (BK * SA) + rb;
        const float* bs = Bs + cur * (BK * SB) + cb;
        #pragma unroll
        for (int kk = 0; kk < BK; ++kk) {{
            float ra[TM], rv[TN];
            #pragma unroll
            for (int i = 0; i < TM / 4; ++i) {{
                const float4 x = *reinterpret_cast<const float4*>(as + kk * SA + i * (LR * 4));
                ra[4 * i] = x.x; ra[4 * i + 1] = x.y; ra[4 * i + 2] = x.z; ra[4 * i + 3] = x.w;
            }}
            #pragma unroll
            for (int j = 0; j < TN / 4; ++j) {{
                const float4 y = *reinterpret_cast<const float4*>(bs + kk * SB + j * (LC * 4));
                rv[4 * j] = y.x; rv[4 * j + 1] = y.y; rv[4 * j + 2] = y.z; rv[4 * j + 3] = y.w;
            }}
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(ra[i], rv[j], acc[i][j]);
        }}
        if (more) stash(cur ^ 1);   // the other buffer was last read before the previous barrier
        __syncthreads();
    }}
    const bool split = gridDim.z > 1;  // a slice of K: the raw partial sums into the workspace
    float* out = C + (split ? (size_t)blockIdx.z * M * N : (size_t)0);
    const bool vecC = (N & 3) == 0 && (reinterpret_cast<size_t>(out) & 15) == 0;
    #pragma unroll
    for (int i = 0; i < TM; ++i) {{
        const int m = bm + rb + (i / 4) * (LR * 4) + (i % 4);
        if (m >= M) continue;
        #pragma unroll
        for (int h = 0; h < TN / 4; ++h) {{
            const int n = bn + cb + h * (LC * 4);
            float v[4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {{
                v[j] = acc[i][h * 4 + j];
                if (!split && n + j < N) v[j] = {epi_j};
            }}
            if (vecC && n < N) {{
                *reinterpret_cast<float4*>(out + (size_t)m * N + n) = make_float4(v[0], v[1], v[2], v[3]);
            }} else {{
                #pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (n + j < N) out[(size_t)m * N + n + j] = v[j];
            }}
        }}
    }}
}}

extern "C" __global__ void __launch_bounds__(NT, MINB) matmul({params}) {{
    kf_sgemm_warp<true>({args});
}}

extern "C" __global__ void __launch_bounds__(NT, MINB) matmul_u({params}) {{
    kf_sgemm_warp<false>({args});
}}

extern "C" __global__ void matmul_sum(const float* __restrict__ W, {bias_p}float* __restrict__ C, int M, int N, int split) {{
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)M * N) return;
    const int n = (int)(e % N);
    float v = 0.0f;
    for (int z = 0; z < split; ++z) v += W[(size_t)z * M * N + e];
    C[e] = {epi_v};
}}
"""


#: Parameters of the default (cuBLAS' SIMT shape: 128 x 128 x 8, four 64 x 64 warps, 16 x 8 per thread).
DEFAULTS: dict[str, int] = {
    "BM": 128,
    "BN": 128,
    "BK": 8,
    "WM": 64,
    "WN": 64,
    "TM": 16,
    "TN": 8,
    "MINB": 2,
    "SWZ": 8,
    "SPLIT": 1,
}


def sgemm_warp(spec: OpSpec, epilogue: str, head: str) -> Recipe:
    """The recipe; ``epilogue`` is the ``epilogue(v, n[, bias])`` device function and ``head`` the
    ``forward`` lines that define a, b, M, N, K and the output ``c`` (a linear layer: its own head)."""
    a, b = ("x", "self.m0.weight") if spec.linear else ("a", "b")
    if spec.linear:  # the weight [N, K] is read as it is (transposing loads): no transpose kernel
        head = """M, K = x.shape
N = self.m0.weight.shape[0]
c = torch.empty((M, N), dtype=x.dtype, device=x.device)"""
    vec = f"K % 4 == 0 and _aligned({a}, {b})" + ("" if spec.linear else " and N % 4 == 0")
    sb = "4" if spec.linear else "0"
    bias = "self.m0.bias, " if spec.bias else ""
    epi_call = "epilogue({v}, {n}, bias)" if spec.bias else "epilogue({v}, {n})"
    forward = f"""{head}
BM, BN, BK = p['BM'], p['BN'], p['BK']
tiles = _cdiv(M, BM) * _cdiv(N, BN)
split = max(1, min(64, 2 * 132 // tiles, K // 512)) if p['SPLIT'] and tiles < 132 else 1
kc = _cdiv(_cdiv(K, split), BK) * BK
split = _cdiv(K, kc)
nt = (BM // p['WM']) * (BN // p['WN']) * 32
smem = 2 * BK * (BM + 4 + BN + {sb}) * 4
grid = (_cdiv(N, BN), _cdiv(M, BM), split)
kern = self.prog.matmul if {vec} else self.prog.matmul_u
if split > 1:
    part = torch.empty((split, M, N), dtype=c.dtype, device=c.device)
    kern({a}, {b}, {bias}part, M, N, K, kc, grid=grid, block=(nt, 1, 1), shared_mem=smem)
    self.prog.matmul_sum(part, {bias}c, M, N, split, grid=(_cdiv(M * N, 256), 1, 1), block=(256, 1, 1))
else:
    kern({a}, {b}, {bias}c, M, N, K, K, grid=grid, block=(nt, 1, 1), shared_mem=smem)
return c
"""
    return Recipe(
        "matmul/sgemm_warp",
        "matmul",
        "cuda",
        _kernel(spec, epilogue, epi_call),
        forward,
        ["x"] if spec.linear else ["a", "b"],
        TunableSpace(
            params={
                "BM": [64, 128, 256],
                "BN": [64, 128, 256],
                "BK": [8, 16, 32],
                "WM": [32, 64],
                "WN": [32, 64],
                "TM": [4, 8, 16],
                "TN": [4, 8, 16],
                "MINB": [1, 2],
                "SWZ": [0, 8],
                "SPLIT": [0, 1],
            },
            restrictions=[
                "WM * WN == 32 * TM * TN",
                "BM % WM == 0 and BN % WN == 0",
                "(BM // WM) * (BN // WN) * 32 <= 512",
                "(BM * BK // 4) % ((BM // WM) * (BN // WN) * 32) == 0",
                "(BN * BK // 4) % ((BM // WM) * (BN // WN) * 32) == 0",
                # accumulators plus ~80 registers of fragments, staged loads and addresses per thread
                "(TM * TN + 80) * (BM // WM) * (BN // WN) * 32 * MINB <= 65536",
                "2 * BK * (BM + BN + 8) * 4 * MINB <= 225000",
            ],
        ),
        dict(DEFAULTS),
        rank=6,
        modules=spec.modules,
        description="warp-tiled SGEMM: BM x BN x BK block tiles, WM x WN warp tiles of TM x TN float4 strips "
        "per thread, A transposed in shared memory, double-buffered with register-staged LDG.128, grouped "
        "block order, split K for few tiles",
    )
