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

Measured on the H200 (benchmarks/h13mm_sgemm_variants.py, CUDA-event medians, TF32 off; 2026-12-02, two
calls): at 4096^3 the default (128 x 256 x 16, eight 64 x 64 warps of 16 x 8, one block per SM) 2.89-2.99 ms
against cuBLAS' 2.69-2.78 ms (0.90-0.94x; sgemm_128x128 0.87-0.89x); 256 x 128 0.89x, 128 x 128 tiles
0.80-0.87x. At the default: matmul_large_k (split K over 64 slices) 0.88x, tall_skinny 0.99x, matmul_irregular
(the 4-byte kernel) 0.75x, where 128 x 128 tiles of 16 x 8 read 0.85-0.87x (a tuner's pick there).
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec


def _kernel(
    spec: OpSpec,
    epilogue: str,
    epi_call: str,
    ta: bool = False,
    tb: bool = False,
    batched: bool = False,
    tri: int = 0,
    variant: bool = False,
) -> str:
    """The kernels. ``ta``: A is stored [K, M] (``A.T`` of the problem; float4 loads along M, stored into
    ``As[k][m]`` as they are); ``tb``: B is stored [N, K] (as a linear layer's weight); ``batched``: grid z is the batch (per-operand element strides ``sa``, ``sb``,
    0 broadcasts; C is [batch, M, N]); ``tri`` 1 / 2: the output is ``tril`` / ``triu`` of the product
    (diagonal ``dg``): tiles entirely outside it skip the K loop, stores past the diagonal write zeros.
    ``variant``: the kernels take ``sa, sb, dg`` after ``kc`` (:mod:`.cookbook_mm_variants`' launches)."""
    bias_p = "const float* __restrict__ bias, " if spec.bias else ""
    bias_a = "bias, " if spec.bias else ""
    epi_j = epi_call.format(v="v[j]", n="n + j")
    epi_v = epi_call.format(v="v", n="n")
    extra = ", int sa, int sb, int dg" if variant else ""
    params = f"const float* __restrict__ A, const float* __restrict__ B, {bias_p}float* __restrict__ C, int M, int N, int K, int kc{extra}"
    args = f"A, B, {bias_a}C, M, N, K, kc" + (", sa, sb, dg" if extra else "")
    return f"""{epilogue}
#define TA {int(ta)}
#define BATCHED {int(batched)}
#define TRI {tri}
#ifndef KF_SMEM_DECL
#define KF_SMEM_DECL extern __shared__ __align__(16) float kf_smem[];
#endif
#define BT {int(spec.linear or tb)}
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
#if BATCHED
    A += (size_t)blockIdx.z * sa;
    B += (size_t)blockIdx.z * sb;
    C += (size_t)blockIdx.z * M * N;
    const int kb = 0, ke = K;
#else
    const int kb = blockIdx.z * kc, ke = min(K, kb + kc);
#endif
#if TRI   // the tile's range of n - m against the kept band (tril: n - m <= dg, triu: n - m >= dg)
    const bool dead = TRI == 1 ? bn - (bm + BM - 1) > dg : bn + BN - 1 - bm < dg;
#else
    const bool dead = false;
#endif
    const int ntiles = dead ? 0 : (ke - kb + BK - 1) / BK;
    const int full = dead ? 0 : (ke - kb) / BK;   // steps without a K tail; a last partial step checks K
    // the thread's global loads: A (and BT's B) as rows x float4 along K, B as rows of K x float4 along N.
    // Rows past M and columns past N are clamped onto the last one (their products are never stored), so
    // only a K tail needs predicates (zero fill: it feeds every output).
    const float* pa[LA];
    #pragma unroll
    for (int i = 0; i < LA; ++i) {{
        const int e = tid + NT * i;
#if TA   // A[k][m]: rows of K x float4 along M
        const int r = e / (BM / 4), m = bm + (e % (BM / 4)) * 4;
        pa[i] = A + (size_t)(kb + r) * M + (VEC ? min(m, M - 4) : 0);
#else
        const int r = e / KQ, q = (e % KQ) * 4;
        pa[i] = A + (size_t)min(bm + r, M - 1) * K + kb + q;
#endif
    }}
    const float* pb[LB];
    #pragma unroll
    for (int i = 0; i < LB; ++i) {{
        const int e = tid + NT * i;
#if BT
        const int r = e / KQ, q = (e % KQ) * 4;
        pb[i] = B + (size_t)min(bn + r, N - 1) * K + kb + q;
#else
        const int r = e / (BN / 4), n = bn + (e % (BN / 4)) * 4;
        pb[i] = B + (size_t)(kb + r) * N + (VEC ? min(n, N - 4) : 0);
#endif
    }}
    float4 ga[LA], gb[LB];
    // 4 consecutive floats of a row along K from p (k: the first one's K index; check: a tail step)
    auto row4 = [&](const float* p, int k, bool check) -> float4 {{
        float4 v;
        if (VEC) {{
            v = !check || k < ke ? __ldg(reinterpret_cast<const float4*>(p)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }} else {{
            v.x = !check || k < ke ? __ldg(p) : 0.0f;
            v.y = !check || k + 1 < ke ? __ldg(p + 1) : 0.0f;
            v.z = !check || k + 2 < ke ? __ldg(p + 2) : 0.0f;
            v.w = !check || k + 3 < ke ? __ldg(p + 3) : 0.0f;
        }}
        return v;
    }};
    auto fetch = [&](int t, bool check) {{
        const int dk = t * BK;
        #pragma unroll
        for (int i = 0; i < LA; ++i) {{
            const int e = tid + NT * i;
#if TA
            const float* p = pa[i] + (size_t)dk * M;
            const bool ok = !check || kb + e / (BM / 4) + dk < ke;
            if (VEC) {{
                ga[i] = ok ? __ldg(reinterpret_cast<const float4*>(p)) : make_float4(0.f, 0.f, 0.f, 0.f);
            }} else {{   // rows clamped onto M - 1
                const int m = bm + (e % (BM / 4)) * 4;
                ga[i].x = ok ? __ldg(p + min(m, M - 1)) : 0.0f;
                ga[i].y = ok ? __ldg(p + min(m + 1, M - 1)) : 0.0f;
                ga[i].z = ok ? __ldg(p + min(m + 2, M - 1)) : 0.0f;
                ga[i].w = ok ? __ldg(p + min(m + 3, M - 1)) : 0.0f;
            }}
#else
            ga[i] = row4(pa[i] + dk, kb + (e % KQ) * 4 + dk, check);
#endif
        }}
        #pragma unroll
        for (int i = 0; i < LB; ++i) {{
            const int e = tid + NT * i;
#if BT
            gb[i] = row4(pb[i] + dk, kb + (e % KQ) * 4 + dk, check);
#else
            const float* p = pb[i] + (size_t)dk * N;
            const bool ok = !check || kb + e / (BN / 4) + dk < ke;
            if (VEC) {{
                gb[i] = ok ? __ldg(reinterpret_cast<const float4*>(p)) : make_float4(0.f, 0.f, 0.f, 0.f);
            }} else {{   // columns clamped onto N - 1
                const int n = bn + (e % (BN / 4)) * 4;
                gb[i].x = ok ? __ldg(p + min(n, N - 1)) : 0.0f;
                gb[i].y = ok ? __ldg(p + min(n + 1, N - 1)) : 0.0f;
                gb[i].z = ok ? __ldg(p + min(n + 2, N - 1)) : 0.0f;
                gb[i].w = ok ? __ldg(p + min(n + 3, N - 1)) : 0.0f;
            }}
#endif
        }}
    }};
    auto stash = [&](int s) {{
        float* as = As + s * (BK * SA);
        float* bs = Bs + s * (BK * SB);
        #pragma unroll
        for (int i = 0; i < LA; ++i) {{
            const int e = tid + NT * i;
#if TA
            const int r = e / (BM / 4), c = (e % (BM / 4)) * 4;
            *reinterpret_cast<float4*>(as + r * SA + c) = ga[i];
#else
            const int r = e / KQ, q = (e % KQ) * 4;
            as[(q + 0) * SA + r] = ga[i].x;
            as[(q + 1) * SA + r] = ga[i].y;
            as[(q + 2) * SA + r] = ga[i].z;
            as[(q + 3) * SA + r] = ga[i].w;
#endif
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
        if (full > 0) fetch(0, false);
        else fetch(0, true);
        stash(0);
    }}
    __syncthreads();
    for (int t = 0; t < ntiles; ++t) {{
        const int cur = t & 1;
        const bool more = t + 1 < ntiles;
        if (t + 1 < full) fetch(t + 1, false);   // in flight during this step's FMAs
        else if (more) fetch(t + 1, true);
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
    const bool split = !BATCHED && gridDim.z > 1;  // a slice of K: the raw partial sums into the workspace
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
#if TRI
                if (TRI == 1 ? n + j - m > dg : n + j - m < dg) v[j] = 0.0f;
#endif
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


#: Parameters of the default: 128 x 256 x 16 block tiles, eight 64 x 64 warps of 16 x 8 per thread, one
#: block per SM (the fastest of benchmarks/h13mm_sgemm_variants.py's sweep at 4096^3 on the H200).
DEFAULTS: dict[str, int] = {
    "BM": 128,
    "BN": 256,
    "BK": 16,
    "WM": 64,
    "WN": 64,
    "TM": 16,
    "TN": 8,
    "MINB": 1,
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
    # PAD (products of two inputs): where K or N is not a multiple of 4, A and B are copied into zero-padded
    # [M, K4] and [K4, N4] buffers, the float4 kernel multiplies them into [M, N4] and the first N columns
    # are copied out (about 0.25 ms of copies at matmul_irregular's 8205 x 2949 x 5921, against the 4-byte
    # kernel's 0.75x of cuBLAS)
    pad = (
        ""
        if spec.linear
        else """
if p['PAD'] and not vec:
    K4, N4 = _cdiv(K, 4) * 4, _cdiv(N, 4) * 4
    A_ = torch.zeros((M, K4), dtype=a.dtype, device=a.device)
    A_[:, :K].copy_(a.reshape(M, K))
    B_ = torch.zeros((K4, N4), dtype=b.dtype, device=b.device)
    B_[:K, :N].copy_(b)
    C_ = torch.empty((M, N4), dtype=c.dtype, device=c.device)
    N_, K_, vec = N4, K4, True"""
    )
    forward = f"""{head}
A_, B_, C_, N_, K_ = {a}, {b}, c, N, K
vec = {vec}{pad}
BM, BN, BK = p['BM'], p['BN'], p['BK']
tiles = _cdiv(M, BM) * _cdiv(N_, BN)
split = max(1, min(64, 2 * 132 // tiles, K_ // 512)) if p['SPLIT'] and tiles < 132 else 1
kc = _cdiv(_cdiv(K_, split), BK) * BK
split = _cdiv(K_, kc)
nt = (BM // p['WM']) * (BN // p['WN']) * 32
smem = 2 * BK * (BM + 4 + BN + {sb}) * 4
grid = (_cdiv(N_, BN), _cdiv(M, BM), split)
kern = self.prog.matmul if vec else self.prog.matmul_u
if split > 1:
    part = torch.empty((split, M, N_), dtype=c.dtype, device=c.device)
    kern(A_, B_, {bias}part, M, N_, K_, kc, grid=grid, block=(nt, 1, 1), shared_mem=smem)
    self.prog.matmul_sum(part, {bias}C_, M, N_, split, grid=(_cdiv(M * N_, 256), 1, 1), block=(256, 1, 1))
else:
    kern(A_, B_, {bias}C_, M, N_, K_, K_, grid=grid, block=(nt, 1, 1), shared_mem=smem)
if C_ is not c:
    c.view(M, N).copy_(C_[:, :N])
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
                "MINB": [1, 2, 3, 4],
                "SWZ": [0, 4, 8, 16],
                "SPLIT": [0, 1],
                "PAD": [0, 1],
            },
            restrictions=[
                "WM * WN == 32 * TM * TN",
                "BM % WM == 0 and BN % WN == 0",
                "(BM // WM) * (BN // WN) * 32 <= 512",
                "(BM * BK // 4) % ((BM // WM) * (BN // WN) * 32) == 0",
                "(BN * BK // 4) % ((BM // WM) * (BN // WN) * 32) == 0",
                # registers: accumulators, the staged loads and ~56 of fragments and addresses per thread
                "(TM * TN + (BM + BN) * BK // ((BM // WM) * (BN // WN) * 32) + 56) * (BM // WM) * (BN // WN) * 32"
                " * MINB <= 65536",
                "2 * BK * (BM + BN + 8) * 4 * MINB <= 225000",
            ],
        ),
        {**DEFAULTS, "PAD": 1},
        rank=7,
        modules=spec.modules,
        description="warp-tiled SGEMM: BM x BN x BK block tiles, WM x WN warp tiles of TM x TN float4 strips "
        "per thread, A transposed in shared memory, double-buffered with register-staged LDG.128, grouped "
        "block order, split K for few tiles",
    )
