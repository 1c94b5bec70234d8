"""fp32 GEMM for CUDA with asynchronous copies: ``matmul/sgemm_async``.

128 x 128 output tiles, 256 threads with 8 x 8 outputs each (FFMA, TF32 never used), K in steps of BK
through STAGES shared-memory stages filled by ``cp.async`` (sm_80+: the copies of the next STAGES - 1 steps are
in flight while this one multiplies; older targets and the CPU emulation copy synchronously).

- A is copied 4 bytes at a time into a transposed, padded tile ``As[k][m]`` (stride 132): a warp's copies
  cover 4 rows x 32 bytes of A and land in 32 distinct banks; B is copied 16 bytes at a time (4 bytes
  where N % 4 or B's alignment rule that out). Both are zero-filled past M, N and K, so every shape runs
  this kernel (no fallback kernel).
- LAYOUT=1: warp tiles of 32 x 64 (lanes 4 x 8, each two 4 x 4 quadrants 16 rows and 32 columns apart), so a
  warp's float4 reads of A and B touch 64 and 128 distinct bytes; LAYOUT=0: the quadrants 64 apart.
- SWZ > 0: blocks run in groups of SWZ tile rows (A's rows stay in L2 across a group).
- ``nn.Linear``: the weight [N, K] is read in place by the same transposing 4-byte copies as A (no
  transpose kernel per call).
- SPLIT=1: where the output has fewer tiles than the SMs and K is long, K is split over grid z; each
  slice writes its partial tile to a workspace and ``matmul_sum`` adds the slices in order.

Expected at 4096^3 on the H200: 2 * 4096^3 FLOP / 50.8 TFLOP/s (cuBLAS' measured rate) = 2.71 ms.
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec

#: cp.async helpers (4- and 16-byte copies with zero fill, commit, wait); synchronous copies without sm_80.
CP_ASYNC = r"""
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KF_CP_ASYNC 1
#endif
#ifndef KF_SMEM_DECL
#define KF_SMEM_DECL extern __shared__ __align__(16) float kf_smem[];
#endif
__device__ __forceinline__ void kf_cp4(float* dst, const float* src, bool ok) {
#ifdef KF_CP_ASYNC
    unsigned s;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(s), "l"(src), "r"(ok ? 4 : 0));
#else
    *dst = ok ? *src : 0.0f;
#endif
}
__device__ __forceinline__ void kf_cp16(float* dst, const float* src, bool ok) {
#ifdef KF_CP_ASYNC
    unsigned s;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(ok ? 16 : 0));
#else
    for (int j = 0; j < 4; ++j) dst[j] = ok ? src[j] : 0.0f;
#endif
}
#ifdef KF_CP_ASYNC
#define KF_COMMIT() asm volatile("cp.async.commit_group;" ::)
#define KF_WAIT(n) asm volatile("cp.async.wait_group %0;" :: "n"(n))
#else
#define KF_COMMIT()
#define KF_WAIT(n)
#endif
"""


def _kernel(spec: OpSpec, epilogue: str, epi_call: str) -> str:
    bias_p = "const float* __restrict__ bias, " if spec.bias else ""
    epi_j = epi_call.format(v="v[j]", n="n + j")
    epi_v = epi_call.format(v="v", n="n")
    return f"""{epilogue}{CP_ASYNC}
#define SA 132
#define BT {int(spec.linear)}
#define SB (BT ? 132 : 128)
#if LAYOUT
#define RO 16
#define CO 32
#else
#define RO 64
#define CO 64
#endif
extern "C" __global__ void __launch_bounds__(256, MINB) matmul(const float* __restrict__ A, const float* __restrict__ B,
        {bias_p}float* __restrict__ C, int M, int N, int K, int kc) {{
    KF_SMEM_DECL
    float* As = kf_smem;                  // [STAGES][BK][SA]: A transposed
    float* Bs = kf_smem + STAGES * BK * SA;   // [STAGES][BK][SB]
    const int tid = threadIdx.x;
    int bx = blockIdx.x, by = blockIdx.y;
#if SWZ > 0
    {{
        const int gx = gridDim.x, gy = gridDim.y, pid = by * gx + bx, span = SWZ * gx;
        const int first = (pid / span) * SWZ, rows = min(gy - first, SWZ);
        by = first + (pid % span) % rows;
        bx = (pid % span) / rows;
    }}
#endif
    const int bm = by * 128, bn = bx * 128;
    const int kb = blockIdx.z * kc, ke = min(K, kb + kc);
    const int ntiles = (ke - kb + BK - 1) / BK;
    const bool vecB = (N & 3) == 0 && (reinterpret_cast<size_t>(B) & 15) == 0;
#if LAYOUT
    const int warp = tid >> 5, lane = tid & 31;
    const int rb = (warp >> 1) * 32 + (lane >> 3) * 4, cb = (warp & 1) * 64 + (lane & 7) * 4;
#else
    const int rb = (tid >> 4) * 4, cb = (tid & 15) * 4;
#endif
    auto load = [&](int t, int s) {{
        const int k0 = kb + t * BK;
        float* as = As + s * (BK * SA);
        float* bs = Bs + s * (BK * SB);
        #pragma unroll
        for (int i = 0; i < BK / 2; ++i) {{
            const int e = tid + 256 * i, c = (e & 7) + 8 * (e >> 10), r = (e >> 3) & 127;
            const int m = bm + r, k = k0 + c;
            const bool ok = m < M && k < ke;
            kf_cp4(as + c * SA + r, ok ? A + (size_t)m * K + k : A, ok);
        }}
#if BT
        #pragma unroll
        for (int i = 0; i < BK / 2; ++i) {{  // B is [N, K] (a linear layer's weight): A's transposing copies
            const int e = tid + 256 * i, c = (e & 7) + 8 * (e >> 10), r = (e >> 3) & 127;
            const int n = bn + r, k = k0 + c;
            const bool ok = n < N && k < ke;
            kf_cp4(bs + c * SB + r, ok ? B + (size_t)n * K + k : B, ok);
        }}
#else
        if (vecB) {{
            #pragma unroll
            for (int i = 0; i < BK / 8; ++i) {{
                const int e = tid + 256 * i, r = e >> 5, c = (e & 31) * 4;
                const int k = k0 + r, n = bn + c;
                const bool ok = k < ke && n < N;
                kf_cp16(bs + r * SB + c, ok ? B + (size_t)k * N + n : B, ok);
            }}
        }} else {{
            #pragma unroll
            for (int i = 0; i < BK / 2; ++i) {{
                const int e = tid + 256 * i, r = e >> 7, c = e & 127;
                const int k = k0 + r, n = bn + c;
                const bool ok = k < ke && n < N;
                kf_cp4(bs + r * SB + c, ok ? B + (size_t)k * N + n : B, ok);
            }}
        }}
#endif
    }};
    float acc[8][8];
    #pragma unroll
    for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {{
        if (s < ntiles) load(s, s);
        KF_COMMIT();
    }}
    int rs = 0, ws = STAGES - 1;
    for (int t = 0; t < ntiles; ++t) {{
        KF_WAIT(STAGES - 2);   // step t has landed (one group per step, empty groups past the end)
        __syncthreads();   // ... for every thread, and stage ws (read in step t - 1) is free
        if (t + STAGES - 1 < ntiles) load(t + STAGES - 1, ws);
        KF_COMMIT();
        const float* as = As + rs * (BK * SA);
        const float* bs = Bs + rs * (BK * SB);
        #pragma unroll
        for (int kk = 0; kk < BK; ++kk) {{
            const float4 a0 = *reinterpret_cast<const float4*>(as + kk * SA + rb);
            const float4 a1 = *reinterpret_cast<const float4*>(as + kk * SA + rb + RO);
            const float4 b0 = *reinterpret_cast<const float4*>(bs + kk * SB + cb);
            const float4 b1 = *reinterpret_cast<const float4*>(bs + kk * SB + cb + CO);
            const float ra[8] = {{a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w}};
            const float rv[8] = {{b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w}};
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(ra[i], rv[j], acc[i][j]);
        }}
        rs = rs + 1 == STAGES ? 0 : rs + 1;
        ws = ws + 1 == STAGES ? 0 : ws + 1;
    }}
    const bool split = gridDim.z > 1;  // a slice of K: the raw partial sums into the workspace
    float* out = C + (split ? (size_t)blockIdx.z * M * N : (size_t)0);
    const bool vecC = (N & 3) == 0 && (reinterpret_cast<size_t>(out) & 15) == 0;
    #pragma unroll
    for (int i = 0; i < 8; ++i) {{
        const int m = bm + rb + (i < 4 ? i : RO + i - 4);
        if (m >= M) continue;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const int n = bn + cb + h * CO;
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

extern "C" __global__ void matmul_sum(const float* __restrict__ W, {bias_p}float* __restrict__ C, int M, int N, int split) {{
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)M * N) return;
    const int n = (int)(e % N);
    float v = 0.0f;
    for (int z = 0; z < split; ++z) v += W[(size_t)z * M * N + e];
    C[e] = {epi_v};
}}
"""


def sgemm_async(spec: OpSpec, epilogue: str, head: str) -> Recipe:
    """The recipe; ``epilogue`` is the ``epilogue(v, n[, bias])`` device function and ``head`` the
    ``forward`` lines that define a, b, M, N, K and the output ``c`` (a linear layer: its own head)."""
    a, b = ("x", "self.m0.weight") if spec.linear else ("a", "b")
    if spec.linear:  # the weight [N, K] is read as it is (transposing copies): no transpose kernel
        head = """M, K = x.shape
N = self.m0.weight.shape[0]
c = torch.empty((M, N), dtype=x.dtype, device=x.device)"""
    sb = 132 if spec.linear else 128
    bias = "self.m0.bias, " if spec.bias else ""
    epi_call = "epilogue({v}, {n}, bias)" if spec.bias else "epilogue({v}, {n})"
    forward = f"""{head}
tiles = _cdiv(M, 128) * _cdiv(N, 128)
split = max(1, min(64, 2 * 132 // tiles, K // 512)) if p['SPLIT'] and tiles < 132 else 1
kc = _cdiv(_cdiv(K, split), p['BK']) * p['BK']
split = _cdiv(K, kc)
smem = p['STAGES'] * p['BK'] * (132 + {sb}) * 4
grid = (_cdiv(N, 128), _cdiv(M, 128), split)
if split > 1:
    part = torch.empty((split, M, N), dtype=c.dtype, device=c.device)
    self.prog.matmul({a}, {b}, {bias}part, M, N, K, kc, grid=grid, block=(256, 1, 1), shared_mem=smem)
    self.prog.matmul_sum(part, {bias}c, M, N, split, grid=(_cdiv(M * N, 256), 1, 1), block=(256, 1, 1))
else:
    self.prog.matmul({a}, {b}, {bias}c, M, N, K, K, grid=grid, block=(256, 1, 1), shared_mem=smem)
return c
"""
    return Recipe(
        "matmul/sgemm_async",
        "matmul",
        "cuda",
        _kernel(spec, epilogue, epi_call),
        forward,
        ["x"] if spec.linear else ["a", "b"],
        TunableSpace(
            params={
                "BK": [8, 16, 32],
                "STAGES": [2, 3, 4],
                "LAYOUT": [0, 1],
                "SWZ": [0, 8],
                "MINB": [1, 2],
                "SPLIT": [0, 1],
            },
            restrictions=["STAGES * BK * 1040 * MINB <= 225000"],
        ),
        {"BK": 16, "STAGES": 3, "LAYOUT": 1, "SWZ": 8, "MINB": 2, "SPLIT": 1},
        rank=6,
        modules=spec.modules,
        description="128x128 tiles, 8x8 per thread in 32x64 warp tiles, STAGES-stage cp.async shared-memory "
        "pipeline (A transposed by 4-byte copies), grouped block order, split K for few tiles",
    )
