"""fp32 matrix-product variants (family ``gemm``, recognised by :mod:`.recognize_mm`): batched products
(``bmm``, 3-D ``matmul`` with a broadcast batch, ``einsum('bij,bjk->bik')``), transposed operands
(``A.T @ B``, ``A @ B.T``, both), flat products of an N-D tensor and a matrix (``einsum('...l,lk->...k')``),
``tril`` / ``triu`` of a product and ``diag(a) @ B`` (a row scale: no GEMM), each with an elementwise
epilogue.

- ``matmul/sgemm_warp``: :mod:`.cookbook_sgemm_warp`'s kernel with the batch on grid z (per-operand
  strides, 0 broadcasts), A read [K, M] by float4 loads along M (``TA``), B read [N, K] by its transposing
  loads (``BT``), and triangular outputs: tiles entirely outside the band skip the K loop (a product's
  ``tril`` costs about half a GEMM), stores past the diagonal write the epilogue of zero. FFMA only.
- ``matmul/strided_tiles``: TILE x TILE local-memory tiles over element strides (OpenCL and CUDA; any shape).
- ``matmul/row_scale``: ``C[m, n] = a[m] * B[m, n]`` (float4 on CUDA where N % 4 == 0): the product's other
  terms are exact zeros, except ``0 * inf`` / ``0 * NaN``: a first pass counts each column's non-finite
  entries, and an output whose column has one outside its own row is NaN, as in the GEMM.
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.cookbook_sgemm_warp import DEFAULTS, _kernel
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec


def _head(spec: OpSpec) -> str:
    """``forward`` lines defining M, N, K, nb (batch), sa, sb (batch strides), dg and the output ``c``."""
    d = spec.mm
    dg = int(d.get("dg", 0))
    lines = ["a = a.contiguous()", "b = b.contiguous()"]
    if d.get("batch"):
        lines += [
            "Ba, M, K = a.shape",
            "Bb, _, N = b.shape",
            "nb = max(Ba, Bb)",
            "sa = M * K if Ba > 1 else 0",
            "sb = K * N if Bb > 1 else 0",
            "c = torch.empty((nb, M, N), dtype=a.dtype, device=a.device)",
        ]
    else:
        lines += ["K, M = a.shape"] if d.get("ta") else ["K = a.shape[-1]", "M = a.numel() // K"]
        lines += ["N = b.shape[0]"] if d.get("tb") else ["N = b.shape[1]"]
        lines += ["nb, sa, sb = 1, 0, 0"]
        shape = "(M, N)" if d.get("ta") else "(*a.shape[:-1], N)"
        lines += [f"c = torch.empty({shape}, dtype=a.dtype, device=a.device)"]
    lines.append(f"dg = {dg}")
    return "\n".join(lines)


def _sgemm_warp(spec: OpSpec, epilogue: str) -> Recipe:
    d = spec.mm
    ta, tb, batched, tri = bool(d.get("ta")), bool(d.get("tb")), bool(d.get("batch")), int(d.get("tri", 0))
    vec = (
        f"{'M' if ta else 'K'} % 4 == 0 and {'K' if tb else 'N'} % 4 == 0 and sa % 4 == 0 and sb % 4 == 0"
        " and _aligned(a, b)"
    )
    forward = f"""{_head(spec)}
BM, BN, BK = p['BM'], p['BN'], p['BK']
tiles = _cdiv(M, BM) * _cdiv(N, BN)
split = max(1, min(64, 2 * 132 // tiles, K // 512)) if p['SPLIT'] and tiles < 132 and nb == 1 else 1
kc = _cdiv(_cdiv(K, split), BK) * BK
split = _cdiv(K, kc) if K > 0 else 1
nt = (BM // p['WM']) * (BN // p['WN']) * 32
smem = 2 * BK * (BM + 4 + BN + {4 if tb else 0}) * 4
kern = self.prog.matmul if {vec} else self.prog.matmul_u
if split > 1:
    part = torch.empty((split, M, N), dtype=c.dtype, device=c.device)
    kern(a, b, part, M, N, K, kc, sa, sb, dg, grid=(_cdiv(N, BN), _cdiv(M, BM), split), block=(nt, 1, 1), shared_mem=smem)
    self.prog.matmul_sum(part, c, M, N, split, grid=(_cdiv(M * N, 256), 1, 1), block=(256, 1, 1))
else:
    kern(a, b, c, M, N, K, K, sa, sb, dg, grid=(_cdiv(N, BN), _cdiv(M, BM), nb), block=(nt, 1, 1), shared_mem=smem)
return c
"""
    kernel = _kernel(
        spec, epilogue, "epilogue({v}, {n})", ta=ta, tb=tb, batched=batched, tri=tri, variant=True
    )
    # the tunable space and restrictions of the plain recipe (the same kernel)
    from kfoundry.plugins.llms.offline.cookbook_sgemm_warp import sgemm_warp

    base = sgemm_warp(spec, epilogue, "")
    return Recipe(
        "matmul/sgemm_warp",
        "gemm",
        "cuda",
        kernel,
        forward,
        ["a", "b"],
        TunableSpace(  # the plain recipe's, less PAD (variant shapes take the 4-byte kernel)
            params={k: v for k, v in base.space.params.items() if k != "PAD"},
            restrictions=list(base.space.restrictions),
        ),
        dict(DEFAULTS),
        rank=7,
        modules=spec.modules,
        description=base.description
        + f" (variant: TA={int(ta)} BT={int(tb)} batched={int(batched)} TRI={tri})",
    )


_STRIDED = """{epilogue}
#define TRI {tri}
KF_KERNEL void matmul(KF_G const float* KF_R A, KF_G const float* KF_R B, KF_G float* KF_R C, int M, int N, int K,
                      int sa, int sb, int am, int ak, int bk, int bn, int dg) {{
    KF_LOCAL float As[TILE][TILE];
    KF_LOCAL float Bs[TILE][TILE + 1];
    const int tx = KF_LID0, ty = KF_LID1;
    const int n0 = KF_GRP1 * TILE, m0 = KF_GRP0 * TILE, z = KF_GRP2;   // row tiles on x (no 65535 cap)
    const int n = n0 + tx, m = m0 + ty;
    A += (size_t)z * sa;
    B += (size_t)z * sb;
    C += (size_t)z * M * N;
    const bool dead = TRI == 1 ? n0 - (m0 + TILE - 1) > dg : TRI == 2 ? n0 + TILE - 1 - m0 < dg : false;
    float acc = 0.0f;
    if (!dead) {{
        for (int k0 = 0; k0 < K; k0 += TILE) {{
            const int ka = k0 + tx, kb = k0 + ty;
            As[ty][tx] = (m < M && ka < K) ? A[(size_t)m * am + (size_t)ka * ak] : 0.0f;
            Bs[ty][tx] = (kb < K && n < N) ? B[(size_t)kb * bk + (size_t)n * bn] : 0.0f;
            KF_SYNC;
            for (int kk = 0; kk < TILE; ++kk) acc += As[ty][kk] * Bs[kk][tx];
            KF_SYNC;
        }}
    }}
    if (m < M && n < N) {{
        float v = acc;
        if (TRI == 1 ? n - m > dg : TRI == 2 ? n - m < dg : false) v = 0.0f;
        C[(size_t)m * N + n] = epilogue(v, n);
    }}
}}
"""

_ROW_SCALE = """{epilogue}
#ifndef KF_ISFINITE
#define KF_ISFINITE(x) (fabsf(x) <= 3.402823466e+38f)   // false for inf and NaN
#endif
// bad[n]: the non-finite entries of B's column n (each makes 0 * B[k, n] NaN in the product's other rows)
KF_KERNEL void matmul_bad(KF_G const float* KF_R B, KF_G int* KF_R bad, int M, int N, int rows) {{
    const int n = KF_GID0;
    if (n >= N) return;
    const int k0 = KF_GRP1 * rows, k1 = min(M, k0 + rows);
    int c = 0;
    for (int k = k0; k < k1; ++k) c += KF_FINITE(B[(size_t)k * N + n]) ? 0 : 1;
    if (c) KF_ATOMIC_ADD(&bad[n], c);
}}

KF_KERNEL void matmul(KF_G const float* KF_R A, KF_G const float* KF_R B, KF_G const int* KF_R bad,
                      KF_G float* KF_R C, int M, int N) {{
    const size_t e = (size_t)KF_GID0;
    if (e >= (size_t)M * N) return;
    const int n = (int)(e % N);
    const float x = B[e];
    C[e] = epilogue(bad[n] - (KF_FINITE(x) ? 0 : 1) > 0 ? KF_NAN : A[e / N] * x, n);
}}
"""

_ROW_SCALE4 = """
extern "C" __global__ void matmul4(const float* __restrict__ A, const float* __restrict__ B, const int* __restrict__ bad,
                                   float* __restrict__ C, int M, int N) {
    const size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x;   // a float4 of a row (N % 4 == 0)
    if (q >= (size_t)M * N / 4) return;
    const size_t e = q * 4;
    const int n = (int)(e % N);
    const float s = __ldg(A + e / N);
    const float4 x = __ldg(reinterpret_cast<const float4*>(B) + q);
    const int* f = bad + n;   // 4 KiB per 1024 columns: L1/L2 resident
    const float nan = nanf("");
    reinterpret_cast<float4*>(C)[q] = make_float4(
        epilogue(__ldg(f + 0) - (KF_ISFINITE(x.x) ? 0 : 1) > 0 ? nan : s * x.x, n),
        epilogue(__ldg(f + 1) - (KF_ISFINITE(x.y) ? 0 : 1) > 0 ? nan : s * x.y, n + 1),
        epilogue(__ldg(f + 2) - (KF_ISFINITE(x.z) ? 0 : 1) > 0 ? nan : s * x.z, n + 2),
        epilogue(__ldg(f + 3) - (KF_ISFINITE(x.w) ? 0 : 1) > 0 ? nan : s * x.w, n + 3));
}
"""

_MACROS = {
    "opencl": {
        "KF_KERNEL": "__kernel",
        "KF_G": "__global",
        "KF_R": "restrict",
        "KF_LOCAL": "__local",
        "KF_LID0": "get_local_id(0)",
        "KF_LID1": "get_local_id(1)",
        "KF_GRP0": "get_group_id(0)",
        "KF_GRP1": "get_group_id(1)",
        "KF_GRP2": "get_group_id(2)",
        "KF_GID0": "get_global_id(0)",
        "KF_SYNC": "barrier(CLK_LOCAL_MEM_FENCE)",
        "KF_ATOMIC_ADD": "atomic_add",
        "KF_NAN": "NAN",
        "KF_FINITE": "isfinite",
    },
    "cuda": {
        "KF_KERNEL": 'extern "C" __global__',
        "KF_G": "",
        "KF_R": "__restrict__",
        "KF_LOCAL": "__shared__",
        "KF_LID0": "threadIdx.x",
        "KF_LID1": "threadIdx.y",
        "KF_GRP0": "blockIdx.x",
        "KF_GRP1": "blockIdx.y",
        "KF_GRP2": "blockIdx.z",
        "KF_GID0": "(blockIdx.x * blockDim.x + threadIdx.x)",
        "KF_SYNC": "__syncthreads()",
        "KF_ATOMIC_ADD": "atomicAdd",
        "KF_NAN": 'nanf("")',
        "KF_FINITE": "KF_ISFINITE",
    },
}


def _lang(src: str, lang: str) -> str:
    for k in sorted(_MACROS[lang], key=len, reverse=True):
        src = src.replace(k, _MACROS[lang][k])
    return src


def _strided(spec: OpSpec, epilogue: str, lang: str) -> Recipe:
    d = spec.mm
    am, ak = ("1", "M") if d.get("ta") else ("K", "1")
    bk, bn = ("1", "K") if d.get("tb") else ("N", "1")
    forward = f"""{_head(spec)}
T = p['TILE']
self.prog.matmul(a, b, c, M, N, K, sa, sb, {am}, {ak}, {bk}, {bn}, dg, grid=(_cdiv(M, T), _cdiv(N, T), nb), block=(T, T, 1))
return c
"""
    kernel = _lang(_STRIDED.format(epilogue=epilogue, tri=int(d.get("tri", 0))), lang)
    return Recipe(
        "matmul/strided_tiles",
        "gemm",
        lang,
        kernel,
        forward,
        ["a", "b"],
        TunableSpace(params={"TILE": [8, 16, 32]}),
        {"TILE": 16},
        rank=3,
        modules=spec.modules,
        description="TILE x TILE local-memory tiles over element strides (batch on grid z, transposed "
        "operands, triangular tiles skipped)",
    )


def _row_scale(spec: OpSpec, epilogue: str, lang: str) -> Recipe:
    kernel = _lang(_ROW_SCALE.format(epilogue=epilogue), lang)
    launch = "self.prog.matmul(a, b, bad, c, M, N, grid=(_cdiv(M * N, p['BLOCK']), 1, 1), block=(p['BLOCK'], 1, 1))"
    if lang == "cuda":
        kernel += _ROW_SCALE4
        launch = (
            "if N % 4 == 0 and _aligned(b, c):\n"
            "    self.prog.matmul4(a, b, bad, c, M, N, grid=(_cdiv(M * N // 4, p['BLOCK']), 1, 1), block=(p['BLOCK'], 1, 1))\n"
            f"else:\n    {launch}"
        )
    forward = f"""a = a.contiguous()
b = b.contiguous()
M = a.shape[0]
N = b.shape[1]
c = torch.empty((M, N), dtype=b.dtype, device=b.device)
bad = torch.zeros((N + 4,), dtype=torch.int32, device=b.device)
rows = 64
self.prog.matmul_bad(b, bad, M, N, rows, grid=(_cdiv(N, p['BLOCK']), _cdiv(M, rows), 1), block=(p['BLOCK'], 1, 1))
{launch}
return c
"""
    return Recipe(
        "matmul/row_scale",
        "gemm",
        lang,
        kernel,
        forward,
        ["a", "b"],
        TunableSpace(params={"BLOCK": [64, 128, 256, 512]}),
        {"BLOCK": 256},
        rank=8,
        modules=spec.modules,
        description="diag(a) @ B as a row scale: C[m, n] = a[m] * B[m, n] (memory-bound, no GEMM); NaN where "
        "another row of B's column n is not finite (0 * inf in the product)",
    )


def recipes(spec: OpSpec, language: str, epilogue: str) -> list[Recipe]:
    """The variant's recipes in ``language``; ``epilogue`` is the ``epilogue(v, n)`` device function."""
    from kfoundry.core.generator import GeneratorUnsupported
    from kfoundry.plugins.llms.offline import cookbook_graph

    if spec.mm.get("diag"):
        out = [_row_scale(spec, epilogue, language)]
    else:
        # a work-item per output: offered up to 2^28 outputs (32-bit launch margin; the warp tiles above)
        out = [_strided(spec, epilogue, language)] if spec.numel <= 1 << 28 else []
        if language == "cuda":
            out.append(_sgemm_warp(spec, epilogue))
    try:  # the lowered graph's recipes (ranks 0-2) as well
        return [*cookbook_graph.recipes(spec, language), *out]
    except GeneratorUnsupported:
        return out
