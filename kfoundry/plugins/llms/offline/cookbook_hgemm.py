"""fp16 / bf16 matrix multiply: fp32 accumulation, the output rounded once to the inputs' dtype.

- CUDA ``matmul/mma_tiles``: tensor cores through ``mma.sync.m16n8k16`` (f16 or bf16 in, f32 accumulate).
  128 x 128 x 32 block tiles, 8 warps of 64 x 32 (4 x 4 MMAs per 16-deep step), STAGES shared-memory
  stages filled by 16-byte ``cp.async`` (rows padded to 40 / 136 halves: conflict-free), fragments by
  ``ldmatrix`` (B with ``.trans``; LDSM=0: 32- and 16-bit shared reads instead). Without sm_80 (and in the CPU emulation) the copies are synchronous,
  fragments are read element by element and each MMA is computed from warp shuffles of the same
  fragments, so the fragment layout is the one checked there. Needs K % 8 == N % 8 == 0 and 16-byte
  aligned A, B; other shapes run ``matmul_scalar`` of the same program.
- CUDA ``matmul/mma_pipe`` (ranked above ``mma_tiles``): the same MMA, 128 x BN x BK block tiles (BN 256:
  8 warps of 64 x 64, 4 x 8 MMAs per k16 step, 8 ``ldmatrix.x4`` for 32 MMAs; BN 128: 64 x 32), STAGES
  cp.async stages of padded rows (BK + 8, BN + 8 halves: ldmatrix conflict-free), one barrier per BK
  tile, the next k16 step's fragments loaded while this one multiplies (two fragment buffers), the
  next stage's copies issued right after the barrier. Defaults 128 x 256 x 32, 4 stages: 254 registers
  (1 block of 8 warps per SM), 106 KB shared. In the CPU emulation ``ldmatrix`` gathers its rows from
  the lanes' own row addresses, as the instruction does, so its addressing is checked there too.
- CUDA ``matmul/half_naive`` and OpenCL ``matmul/half_naive`` / ``matmul/half_tiles``: portable, one
  output per thread (tiles: 16 x 16 local-memory tiles), fp16 through ``vload_half``/``vstore_half_rte``
  on OpenCL, bf16 as 16-bit patterns (round to nearest even on store). PoCL has no tensor cores.
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.cookbook_sgemm import CP_ASYNC
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec

#: 16-bit <-> float for CUDA (bit patterns in unsigned short; no cuda_fp16.h needed under NVRTC).
CU_HALF = r"""
__device__ __forceinline__ float kf_bits_f(unsigned u) { union { unsigned u; float f; } v; v.u = u; return v.f; }
__device__ __forceinline__ unsigned kf_f_bits(float f) { union { unsigned u; float f; } v; v.f = f; return v.u; }
#if HALF_BF16
__device__ __forceinline__ float kf_ld(unsigned short h) { return kf_bits_f((unsigned)h << 16); }
__device__ __forceinline__ unsigned short kf_st(float f) {
    const unsigned x = kf_f_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);  // NaN stays NaN
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
#elif defined(__CUDA_ARCH__)
__device__ __forceinline__ float kf_ld(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short kf_st(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else
__device__ __forceinline__ float kf_ld(unsigned short h) {
    const unsigned s = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { const float v = (float)m * 5.9604644775390625e-8f; return s ? -v : v; }
    if (e == 31) return kf_bits_f(s | 0x7f800000u | (m << 13));
    return kf_bits_f(s | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ unsigned short kf_st(float f) {
    const unsigned x = kf_f_bits(f), s = (x >> 16) & 0x8000u, m = x & 0x7fffffu;
    const int e = (int)((x >> 23) & 0xffu) - 112;
    if (((x >> 23) & 0xffu) == 0xffu) return (unsigned short)(s | 0x7c00u | (m ? 0x200u : 0u));
    if (e >= 31) return (unsigned short)(s | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (unsigned short)s;
        const unsigned mm = m | 0x800000u, shift = (unsigned)(14 - e), r = mm >> shift;
        const unsigned rem = mm & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        return (unsigned short)(s | (r + ((rem > halfway || (rem == halfway && (r & 1u))) ? 1u : 0u)));
    }
    const unsigned r = ((unsigned)e << 10) | (m >> 13), rem = m & 0x1fffu;
    return (unsigned short)(s | (r + ((rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ? 1u : 0u)));
}
#endif
"""

_CL_HALF = r"""
#if HALF_BF16
typedef ushort kf_h;
static inline float kf_ld(__global const kf_h* p, size_t i) { return as_float((uint)p[i] << 16); }
static inline void kf_st(__global kf_h* p, size_t i, float f) {
    uint x = as_uint(f);
    p[i] = (x & 0x7fffffffu) > 0x7f800000u ? (ushort)((x >> 16) | 0x40u) : (ushort)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
#else
typedef half kf_h;
static inline float kf_ld(__global const kf_h* p, size_t i) { return vload_half(i, p); }
static inline void kf_st(__global kf_h* p, size_t i, float f) { vstore_half_rte(f, i, p); }
#endif
"""


def _scalar_kernel(epi: str) -> str:
    """``matmul_scalar``: one thread per output, fp32 accumulation (any shape and alignment)."""
    return f"""extern "C" __global__ void matmul_scalar(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
                                         unsigned short* __restrict__ C, int M, int N, int K) {{
    const int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y * blockDim.y + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc = fmaf(kf_ld(A[(size_t)m * K + k]), kf_ld(B[(size_t)k * N + n]), acc);
    C[(size_t)m * N + n] = kf_st({epi.format(v="acc", n="n")});
}}
"""


def _mma_helpers(epilogue: str) -> str:
    """The epilogue, 16-bit conversions, cp.async, ``kf_pack``, ``kf_mma`` (emulated by warp shuffles
    without sm_80) and ``kf_saddr``: shared by both tensor-core programs."""
    return f"""{epilogue}{CU_HALF}{CP_ASYNC}
#ifndef KF_HSMEM_DECL
#define KF_HSMEM_DECL extern __shared__ __align__(16) unsigned short kf_hsmem[];
#endif
#if HALF_BF16
#define KF_MMA_TYPES "f32.bf16.bf16.f32"
#else
#define KF_MMA_TYPES "f32.f16.f16.f32"
#endif
__device__ __forceinline__ unsigned kf_pack(unsigned short lo, unsigned short hi) {{ return (unsigned)lo | ((unsigned)hi << 16); }}
// d += a (16x16, row) * b (16x8, col): the m16n8k16 fragments of one warp
__device__ __forceinline__ void kf_mma(float* d, const unsigned* a, const unsigned* b) {{
#ifdef KF_CP_ASYNC
    asm volatile("mma.sync.aligned.m16n8k16.row.col." KF_MMA_TYPES " {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    for (int j = 0; j < 4; ++j) {{  // k = 2j, 2j + 1 and 8 + 2j, 9 + 2j from lane group j of each row / column
        unsigned av[4], b0[2], b1[2];
        for (int r = 0; r < 4; ++r) av[r] = (unsigned)__shfl_xor_sync(0xffffffffu, (long long)a[r], lane ^ (g * 4 + j));
        for (int r = 0; r < 2; ++r) {{
            b0[r] = (unsigned)__shfl_xor_sync(0xffffffffu, (long long)b[r], lane ^ (2 * q * 4 + j));
            b1[r] = (unsigned)__shfl_xor_sync(0xffffffffu, (long long)b[r], lane ^ ((2 * q + 1) * 4 + j));
        }}
        for (int h = 0; h < 2; ++h) {{  // the two k of each register
            const int sh = 16 * h;
            const float ag = kf_ld((unsigned short)(av[0] >> sh)), ag8 = kf_ld((unsigned short)(av[1] >> sh));
            const float ak = kf_ld((unsigned short)(av[2] >> sh)), ak8 = kf_ld((unsigned short)(av[3] >> sh));
            const float x0 = kf_ld((unsigned short)(b0[0] >> sh)), x1 = kf_ld((unsigned short)(b1[0] >> sh));
            const float y0 = kf_ld((unsigned short)(b0[1] >> sh)), y1 = kf_ld((unsigned short)(b1[1] >> sh));
            d[0] += ag * x0 + ak * y0; d[1] += ag * x1 + ak * y1;
            d[2] += ag8 * x0 + ak8 * y0; d[3] += ag8 * x1 + ak8 * y1;
        }}
    }}
#endif
}}
#ifdef KF_CP_ASYNC
__device__ __forceinline__ unsigned kf_saddr(const void* p) {{
    unsigned s;
    asm volatile("{{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }}" : "=r"(s) : "l"(p));
    return s;
}}
#endif
"""


def _mma_kernel(epilogue: str, epi: str) -> str:
    return f"""{_mma_helpers(epilogue)}
#define SAH 40
#define SBH 136
{_scalar_kernel(epi)}
extern "C" __global__ void __launch_bounds__(256) matmul(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
                                                         unsigned short* __restrict__ C, int M, int N, int K) {{
    KF_HSMEM_DECL
    unsigned short* As = kf_hsmem;                          // [STAGES][128][SAH]: A rows, k contiguous
    unsigned short* Bs = kf_hsmem + STAGES * 128 * SAH;     // [STAGES][32][SBH]: B rows, n contiguous
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
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
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;   // the warp's 64 x 32 piece of the tile
    const int ntiles = (K + 31) / 32;
    auto load = [&](int t, int s) {{
        const int k0 = t * 32;
        unsigned short* as = As + s * (128 * SAH);
        unsigned short* bs = Bs + s * (32 * SBH);
        #pragma unroll
        for (int i = 0; i < 2; ++i) {{
            const int c = tid + 256 * i, r = c >> 2, col = (c & 3) * 8;
            const bool ok = bm + r < M && k0 + col < K;
            kf_cp16(reinterpret_cast<float*>(as + r * SAH + col),
                    reinterpret_cast<const float*>(ok ? A + (size_t)(bm + r) * K + k0 + col : A), ok);
        }}
        #pragma unroll
        for (int i = 0; i < 2; ++i) {{
            const int c = tid + 256 * i, r = c >> 4, col = (c & 15) * 8;
            const bool ok = k0 + r < K && bn + col < N;
            kf_cp16(reinterpret_cast<float*>(bs + r * SBH + col),
                    reinterpret_cast<const float*>(ok ? B + (size_t)(k0 + r) * N + bn + col : B), ok);
        }}
    }};
    float acc[4][4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {{
        if (s < ntiles) load(s, s);
        KF_COMMIT();
    }}
    int rs = 0, ws = STAGES - 1;
    for (int t = 0; t < ntiles; ++t) {{
        KF_WAIT(STAGES - 2);
        __syncthreads();
        if (t + STAGES - 1 < ntiles) load(t + STAGES - 1, ws);
        KF_COMMIT();
        const unsigned short* as = As + rs * (128 * SAH);
        const unsigned short* bs = Bs + rs * (32 * SBH);
        #pragma unroll
        for (int kk = 0; kk < 32; kk += 16) {{
            unsigned af[4][4], bf[4][2];
#if defined(KF_CP_ASYNC) && LDSM
            #pragma unroll
            for (int i = 0; i < 4; ++i) {{
                const unsigned short* p = as + (wm + i * 16 + (lane & 15)) * SAH + kk + (lane >> 4) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];"
                             : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3]) : "r"(kf_saddr(p)));
            }}
            #pragma unroll
            for (int j = 0; j < 4; j += 2) {{
                const unsigned short* p = bs + (kk + (lane & 15)) * SBH + wn + j * 8 + (lane >> 4) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];"
                             : "=r"(bf[j][0]), "=r"(bf[j][1]), "=r"(bf[j + 1][0]), "=r"(bf[j + 1][1]) : "r"(kf_saddr(p)));
            }}
#else
            const int g = lane >> 2, q = lane & 3;
            for (int i = 0; i < 4; ++i) {{
                const unsigned short* p = as + (wm + i * 16 + g) * SAH + kk + 2 * q;
                af[i][0] = kf_pack(p[0], p[1]);
                af[i][1] = kf_pack(p[8 * SAH], p[8 * SAH + 1]);
                af[i][2] = kf_pack(p[8], p[9]);
                af[i][3] = kf_pack(p[8 * SAH + 8], p[8 * SAH + 9]);
            }}
            for (int j = 0; j < 4; ++j) {{
                const unsigned short* p = bs + (kk + 2 * q) * SBH + wn + j * 8 + g;
                bf[j][0] = kf_pack(p[0], p[SBH]);
                bf[j][1] = kf_pack(p[8 * SBH], p[9 * SBH]);
            }}
#endif
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j) kf_mma(acc[i][j], af[i], bf[j]);
        }}
        rs = rs + 1 == STAGES ? 0 : rs + 1;
        ws = ws + 1 == STAGES ? 0 : ws + 1;
    }}
    const int g = lane >> 2, q = lane & 3;
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const int m = bm + wm + i * 16 + g + 8 * h;
            if (m >= M) continue;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {{
                const int n = bn + wn + j * 8 + 2 * q;
                if (n >= N) continue;
                const unsigned short lo = kf_st({epi.format(v="acc[i][j][2 * h]", n="n")});
                const unsigned short hi = kf_st({epi.format(v="acc[i][j][2 * h + 1]", n="n + 1")});
                *reinterpret_cast<unsigned*>(C + (size_t)m * N + n) = kf_pack(lo, hi);
            }}
        }}
}}
"""


#: ``matmul/mma_pipe``'s kernel (``@EPI_LO@`` / ``@EPI_HI@``: the epilogue of an output pair).
_PIPE = r"""
#define WN (BN / 4)                 // warp tile: 64 rows x WN columns (warps 2 x 4 over the 128 x BN block tile)
#define NJ (WN / 8)                 // n8 MMA columns per warp
#define KS (BK / 16)                // k16 MMA steps per BK tile
#define SA (BK + 8)                 // padded row strides (halves): a row is 16 bytes past a multiple of 128,
#define SB (BN + 8)                 // so ldmatrix's 8 rows of 16 bytes hit 8 distinct bank groups
#define A_ST (128 * SA)             // one stage of A: [128][SA], k contiguous
#define B_ST (BK * SB)              // one stage of B: [BK][SB], n contiguous
#define ACH (128 * BK / 8 / 256)    // 16-byte copies per thread and stage: A
#define BCH (BK * BN / 8 / 256)     // ... B
// lane l's value v as seen by lane src (the emulated ldmatrix's row addresses)
__device__ __forceinline__ int kf_lane(int v, int src) {
    return (int)__shfl_xor_sync(0xffffffffu, (long long)v, (int)(threadIdx.x & 31) ^ src);
}
// ldmatrix.x4 (TRANS: .trans): lane l gives the row address (halves from the shared base) of row l & 7 of
// matrix l >> 3; r[i] gets matrix i's row l / 4, columns 2 (l % 4) + {0, 1} (TRANS: rows 2 (l % 4) + {0, 1},
// column l / 4), the lower index in the low half
template <int TRANS>
__device__ __forceinline__ void kf_ldsm(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                                        const unsigned short* sm, unsigned sbase, int off) {
#ifdef KF_CP_ASYNC
    const unsigned a = sbase + 2u * (unsigned)off;
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
#else
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    unsigned* r[4] = {&r0, &r1, &r2, &r3};
    for (int i = 0; i < 4; ++i) {
        if (TRANS) {
            const int p0 = kf_lane(off, 8 * i + 2 * q), p1 = kf_lane(off, 8 * i + 2 * q + 1);
            *r[i] = kf_pack(sm[p0 + g], sm[p1 + g]);
        } else {
            const int p = kf_lane(off, 8 * i + g);
            *r[i] = kf_pack(sm[p + 2 * q], sm[p + 2 * q + 1]);
        }
    }
#endif
}
// 16 bytes global -> shared (dst: generic pointer and shared address of the same bytes), zeros where !ok
__device__ __forceinline__ void kf_cpa(unsigned short* dst, unsigned sdst, const unsigned short* src, bool ok) {
#ifdef KF_CP_ASYNC
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(sdst), "l"(src), "r"(ok ? 16 : 0));
#else
    for (int j = 0; j < 8; ++j) dst[j] = ok ? src[j] : (unsigned short)0;
#endif
}

@SCALAR@
extern "C" __global__ void __launch_bounds__(256, 1) matmul(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
                                                            unsigned short* __restrict__ C, int M, int N, int K) {
    KF_HSMEM_DECL
    unsigned short* hs = kf_hsmem;   // [STAGES][128][SA] A tiles, then [STAGES][BK][SB] B tiles
#ifdef KF_CP_ASYNC
    const unsigned sbase = kf_saddr(kf_hsmem);
#else
    const unsigned sbase = 0;
#endif
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int bx = blockIdx.x, by = blockIdx.y;
#if SWZ > 0
    {   // groups of SWZ tile rows, column-major inside a group (a group's A rows and B columns stay in L2)
        const int gx = gridDim.x, gy = gridDim.y, pid = by * gx + bx, span = SWZ * gx;
        const int first = (pid / span) * SWZ, rows = min(gy - first, SWZ);
        by = first + (pid % span) % rows;
        bx = (pid % span) / rows;
    }
#endif
    const int bm = by * 128, bn = bx * BN;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * WN;
    const int ntiles = (K + BK - 1) / BK;
    // stage s <- k tile t (16-byte copies; rows past M / K and columns past N zero-filled: K % 8 == N % 8 == 0).
    // A: thread tid copies rows ar + i * AR, columns ac..ac+7 of the tile; B: rows br + i * BR, columns bc..bc+7
    const int ar = tid / (BK / 8), ac = (tid % (BK / 8)) * 8, br = tid / (BN / 8), bc = (tid % (BN / 8)) * 8;
    const unsigned short* ga = A + (size_t)min(bm + ar, M - 1) * K + ac;
    const unsigned short* gb = B + bn + bc;
    auto load = [&](int t, int s) {
        const int k0 = t * BK;
        #pragma unroll
        for (int i = 0; i < ACH; ++i) {
            const int r = ar + i * (256 / (BK / 8));
            const bool ok = bm + r < M && k0 + ac < K;
            const int o = s * A_ST + r * SA + ac;
            kf_cpa(hs + o, sbase + 2u * (unsigned)o, ok ? ga + (size_t)i * (256 / (BK / 8)) * K + k0 : A, ok);
        }
        #pragma unroll
        for (int i = 0; i < BCH; ++i) {
            const int r = br + i * (256 / (BN / 8));
            const bool ok = k0 + r < K && bn + bc < N;
            const int o = STAGES * A_ST + s * B_ST + r * SB + bc;
            kf_cpa(hs + o, sbase + 2u * (unsigned)o, ok ? gb + (size_t)(k0 + r) * N : B, ok);
        }
    };
    // the warp's fragments of k16 step kk of stage s: A 4 x (16 x 16), B NJ x (16 x 8)
    auto frag = [&](unsigned (&af)[4][4], unsigned (&bf)[NJ][2], int s, int kk) {
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            kf_ldsm<0>(af[i][0], af[i][1], af[i][2], af[i][3], hs, sbase,
                       s * A_ST + (wm + i * 16 + (lane & 15)) * SA + kk + (lane >> 4) * 8);
        #pragma unroll
        for (int j = 0; j < NJ; j += 2)
            kf_ldsm<1>(bf[j][0], bf[j][1], bf[j + 1][0], bf[j + 1][1], hs, sbase,
                       STAGES * A_ST + s * B_ST + (kk + (lane & 15)) * SB + wn + j * 8 + (lane >> 4) * 8);
    };
    float acc[4][NJ][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < NJ; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ntiles) load(s, s);
        KF_COMMIT();
    }
    KF_WAIT(STAGES - 2);
    __syncthreads();
    unsigned af[2][4][4], bf[2][NJ][2];
    int rs = 0, ws = STAGES - 1;
    frag(af[0], bf[0], rs, 0);
    for (int t = 0; t < ntiles; ++t) {
        #pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            if (ks == KS - 1) {
                // tile t + 1 has landed (t + STAGES groups committed, STAGES - 2 may pend) and every warp
                // has read its last fragments of tile t - 1's stage, which the next iteration refills
                KF_WAIT(STAGES - 2);
                __syncthreads();
                rs = rs + 1 == STAGES ? 0 : rs + 1;
            }
            frag(af[(ks + 1) & 1], bf[(ks + 1) & 1], rs, ((ks + 1) % KS) * 16);
            if (ks == 0) {
                if (t + STAGES - 1 < ntiles) load(t + STAGES - 1, ws);
                KF_COMMIT();
                ws = ws + 1 == STAGES ? 0 : ws + 1;
            }
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j) kf_mma(acc[i][j], af[ks & 1][i], bf[ks & 1][j]);
        }
    }
    const int g = lane >> 2, q = lane & 3;
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = bm + wm + i * 16 + g + 8 * h;
            if (m >= M) continue;
            #pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int n = bn + wn + j * 8 + 2 * q;
                if (n >= N) continue;
                const unsigned short lo = kf_st(@EPI_LO@);
                const unsigned short hi = kf_st(@EPI_HI@);
                *reinterpret_cast<unsigned*>(C + (size_t)m * N + n) = kf_pack(lo, hi);
            }
        }
}
"""


def _pipe_kernel(epilogue: str, epi: str) -> str:
    """``matmul/mma_pipe``: 128 x BN x BK block tiles, 64 x BN/4 warp tiles, fragments double-buffered."""
    return _mma_helpers(epilogue) + _PIPE.replace("@SCALAR@", _scalar_kernel(epi)).replace(
        "@EPI_LO@", epi.format(v="acc[i][j][2 * h]", n="n")
    ).replace("@EPI_HI@", epi.format(v="acc[i][j][2 * h + 1]", n="n + 1"))


def _dtype_define(spec: OpSpec) -> dict[str, int]:
    return {"HALF_BF16": int(spec.dtype == "bfloat16")}


_HEAD = """K = a.shape[-1]
M = a.numel() // K
N = b.shape[1]
c = torch.empty((*a.shape[:-1], N), dtype=a.dtype, device=a.device)"""


def cuda_recipes(spec: OpSpec, epilogue: str, epi: str) -> list[Recipe]:
    """``epilogue``: the ``epilogue(v, n)`` device function; ``epi``: its call with ``{v}``, ``{n}``."""
    kernel = _mma_kernel(epilogue, epi)
    scalar = f"{epilogue}{CU_HALF}{_scalar_kernel(epi)}"
    naive = f"""{_HEAD}
self.prog.matmul_scalar(a, b, c, M, N, K, grid=(_cdiv(N, 16), _cdiv(M, 16), 1), block=(16, 16, 1))
return c
"""
    mma = f"""{_HEAD}
if K % 8 == 0 and N % 8 == 0 and _aligned(a, b, c):
    smem = p['STAGES'] * (128 * 40 + 32 * 136) * 2
    self.prog.matmul(a, b, c, M, N, K, grid=(_cdiv(N, 128), _cdiv(M, 128), 1), block=(256, 1, 1), shared_mem=smem)
else:
    self.prog.matmul_scalar(a, b, c, M, N, K, grid=(_cdiv(N, 16), _cdiv(M, 16), 1), block=(16, 16, 1))
return c
"""
    pipe = f"""{_HEAD}
if K % 8 == 0 and N % 8 == 0 and _aligned(a, b, c):
    smem = p['STAGES'] * (128 * (p['BK'] + 8) + p['BK'] * (p['BN'] + 8)) * 2
    self.prog.matmul(a, b, c, M, N, K, grid=(_cdiv(N, p['BN']), _cdiv(M, 128), 1), block=(256, 1, 1), shared_mem=smem)
else:
    self.prog.matmul_scalar(a, b, c, M, N, K, grid=(_cdiv(N, 16), _cdiv(M, 16), 1), block=(16, 16, 1))
return c
"""
    d = _dtype_define(spec)
    return [
        Recipe(
            "matmul/mma_pipe",
            "matmul",
            "cuda",
            _pipe_kernel(epilogue, epi),
            pipe,
            ["a", "b"],
            TunableSpace(
                params={
                    "BN": [128, 256],
                    "BK": [32, 64],
                    "STAGES": [3, 4],
                    "SWZ": [0, 8],
                    "HALF_BF16": [d["HALF_BF16"]],
                }
            ),
            {"BN": 256, "BK": 32, "STAGES": 4, "SWZ": 8, **d},
            rank=7,
            description="tensor cores (mma.sync m16n8k16, fp32 accumulation), 128xBNx32 tiles, 64x64 warp "
            "tiles, 4 cp.async stages, ldmatrix fragments double-buffered across k16 steps",
        ),
        Recipe(
            "matmul/half_naive",
            "matmul",
            "cuda",
            scalar,
            naive,
            ["a", "b"],
            TunableSpace(params={"STAGES": [3], "SWZ": [0], "LDSM": [0], "HALF_BF16": [d["HALF_BF16"]]}),
            {"STAGES": 3, "SWZ": 0, "LDSM": 0, **d},
            rank=0,
            description="one thread per output, fp32 accumulation (the portable baseline)",
        ),
        Recipe(
            "matmul/mma_tiles",
            "matmul",
            "cuda",
            kernel,
            mma,
            ["a", "b"],
            TunableSpace(
                params={"STAGES": [2, 3, 4], "SWZ": [0, 8], "LDSM": [0, 1], "HALF_BF16": [d["HALF_BF16"]]}
            ),
            {"STAGES": 3, "SWZ": 8, "LDSM": 1, **d},
            rank=6,
            description="tensor cores (mma.sync m16n8k16, fp32 accumulation), 128x128x32 tiles, 64x32 warp "
            "tiles, cp.async stages, ldmatrix fragments",
        ),
    ]


def opencl_recipes(spec: OpSpec, epilogue: str, epi: str) -> list[Recipe]:
    """Portable fp16/bf16 kernels for OpenCL (float accumulation; no tensor cores)."""
    args = "__global const kf_h* restrict A, __global const kf_h* restrict B, __global kf_h* restrict C, int M, int N, int K"
    naive = f"""{epilogue}{_CL_HALF}
__kernel void matmul({args}) {{
    int n = get_global_id(0), m = get_global_id(1);
    if (m >= M || n >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += kf_ld(A, (size_t)m * K + k) * kf_ld(B, (size_t)k * N + n);
    kf_st(C, (size_t)m * N + n, {epi.format(v="acc", n="n")});
}}
"""
    tiled = f"""{epilogue}{_CL_HALF}
__kernel void matmul({args}) {{
    __local float As[TS][TS];
    __local float Bs[TS][TS + 1];
    int lx = get_local_id(0), ly = get_local_id(1);
    int n = get_group_id(0) * TS + lx, m = get_group_id(1) * TS + ly;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TS) {{
        As[ly][lx] = (m < M && t + lx < K) ? kf_ld(A, (size_t)m * K + t + lx) : 0.0f;
        Bs[ly][lx] = (n < N && t + ly < K) ? kf_ld(B, (size_t)(t + ly) * N + n) : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; ++k) acc += As[ly][k] * Bs[k][lx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    if (m < M && n < N) kf_st(C, (size_t)m * N + n, {epi.format(v="acc", n="n")});
}}
"""
    d = _dtype_define(spec)
    fwd = f"""{_HEAD}
self.prog.matmul(a, b, c, M, N, K, grid=(_cdiv(N, p['TS']), _cdiv(M, p['TS']), 1), block=(p['TS'], p['TS'], 1))
return c
"""
    space = TunableSpace(params={"TS": [8, 16], "HALF_BF16": [d["HALF_BF16"]]})
    return [
        Recipe(
            "matmul/half_naive",
            "matmul",
            "opencl",
            naive,
            fwd,
            ["a", "b"],
            space,
            {"TS": 16, **d},
            rank=0,
            description="one work-item per output, fp32 accumulation",
        ),
        Recipe(
            "matmul/half_tiles",
            "matmul",
            "opencl",
            tiled,
            fwd,
            ["a", "b"],
            space,
            {"TS": 16, **d},
            rank=2,
            description="TS x TS local-memory tiles converted to fp32, fp32 accumulation",
        ),
    ]
