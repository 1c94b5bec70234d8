"""Matrix multiply (and ``nn.Linear``) recipes: naive → vector loads → local tiling → register blocking.

OpenCL kernels multiply-accumulate with ``a * b + c`` rather than ``fma()``: PoCL lowers ``fma`` to a
correctly-rounded library call, several times slower than the vector multiply-add it can inline.

C = A @ B (+ bias) with an optional elementwise epilogue. For ``nn.Linear`` the weight [N, K] is first
transposed by a small kernel in the same program, so every recipe reads B as [K, N].
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline import cookbook_hgemm
from kfoundry.plugins.llms.offline.cookbook_sgemm import sgemm_async
from kfoundry.plugins.llms.offline.cookbook_sgemm_warp import sgemm_warp
from kfoundry.plugins.llms.offline.elementwise_ops import prelude
from kfoundry.plugins.llms.offline.index_width import adapt
from kfoundry.plugins.llms.offline.recipe import OPENCL_VECTOR_HELPERS, Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec

_CL_TRANSPOSE = """
__kernel void transpose(__global const float* restrict W, __global float* restrict WT, int N, int K) {
    int k = get_global_id(0);
    int n = get_global_id(1);
    if (k < K && n < N) WT[k * N + n] = W[n * K + k];
}
"""

_CU_TRANSPOSE = """
extern "C" __global__ void transpose(const float* __restrict__ W, float* __restrict__ WT, int N, int K) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    int n = blockIdx.y * blockDim.y + threadIdx.y;
    if (k < K && n < N) WT[k * N + n] = W[n * K + k];
}
"""


def _epilogue(spec: OpSpec, lang: str) -> str:
    expr = spec.expr(lang) if spec.expr else "v"
    bias = "v = v + bias[n];" if spec.bias else ""
    qual = "static inline" if lang == "opencl" else "__device__ __forceinline__"
    ptr = "__global const float* restrict bias" if lang == "opencl" else "const float* __restrict__ bias"
    args = f"float v, int n, {ptr}" if spec.bias else "float v, int n"
    return f"{prelude(expr, lang)}{qual} float epilogue({args}) {{\n    {bias}\n    return {expr};\n}}\n"


def _epi_call(spec: OpSpec, value: str, col: str) -> str:
    return f"epilogue({value}, {col}, bias)" if spec.bias else f"epilogue({value}, {col})"


def _args(spec: OpSpec, lang: str) -> str:
    if lang == "opencl":
        b = "__global const float* restrict bias, " if spec.bias else ""
        return (
            "__global const float* restrict A, __global const float* restrict B, "
            f"{b}__global float* restrict C, int M, int N, int K"
        )
    b = "const float* __restrict__ bias, " if spec.bias else ""
    return f"const float* __restrict__ A, const float* __restrict__ B, {b}float* __restrict__ C, int M, int N, int K"


def _tail_kernel(spec: OpSpec, args: str) -> str:
    """Columns [n_start, N) one work-item each: the columns a vector recipe's whole vectors leave over."""
    return f"""
__kernel void matmul_tail({args}, int n_start) {{
    int n = n_start + get_global_id(0);
    int m = get_global_id(1);
    if (m >= M || n >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[m * K + k] * B[k * N + n];
    C[m * N + n] = {_epi_call(spec, "acc", "n")};
}}
"""


def _forward(
    spec: OpSpec, grid: str, block: str, fallback: tuple[str, str, str] | None = None, width: str = ""
) -> tuple[str, list[str]]:
    """``forward``: M, N, K from the inputs. ``fallback`` (kernel, grid, condition): where the condition or
    16-byte alignment of B and C fails, that kernel (a scalar one in the same program) runs instead."""
    a, b = ("x", "wt") if spec.linear else ("a", "b")
    bias = "self.m0.bias, " if spec.bias else ""
    call = f"self.prog.matmul({a}, {b}, {bias}c, M, N, K, grid={grid}, block={block})"
    if (
        width
    ):  # the kernel covers the first NF columns (whole vectors, the grid sized by NF); matmul_tail the rest
        call = (
            f"NF = N - N % ({width})\nif NF:\n    {call}\nif NF < N:\n"
            f"    self.prog.matmul_tail({a}, {b}, {bias}c, M, N, K, NF, grid=(N - NF, _cdiv(M, 16), 1), "
            "block=(1, 16, 1))"
        )
    if fallback is not None:
        name, fgrid, cond = fallback
        call = (
            f"if {cond} and _aligned({b}, c):\n    {call}\nelse:\n"
            f"    self.prog.{name}({a}, {b}, {bias}c, M, N, K, grid={fgrid}, block={block})"
        )
    if spec.linear:
        head = """M, K = x.shape
w = self.m0.weight
N = w.shape[0]
wt = torch.empty((K, N), dtype=x.dtype, device=x.device)
self.prog.transpose(w, wt, N, K, grid=(_cdiv(K, 16), _cdiv(N, 16), 1), block=(16, 16, 1))
c = torch.empty((M, N), dtype=x.dtype, device=x.device)"""
        return f"{head}\n{call}\nreturn c\n", ["x"]
    head = """K = a.shape[-1]
M = a.numel() // K
N = b.shape[1]
c = torch.empty((*a.shape[:-1], N), dtype=a.dtype, device=a.device)"""
    return f"{head}\n{call}\nreturn c\n", ["a", "b"]


def opencl_recipes(spec: OpSpec) -> list[Recipe]:
    out: list[Recipe] = []
    pre = _epilogue(spec, "opencl") + (_CL_TRANSPOSE if spec.linear else "")
    args = _args(spec, "opencl")

    naive = f"""{pre}
__kernel void matmul({args}) {{
    int n = get_global_id(0);
    int m = get_global_id(1);
    if (m >= M || n >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[m * K + k] * B[k * N + n];
    C[m * N + n] = {_epi_call(spec, "acc", "n")};
}}
"""
    body, fargs = _forward(
        spec, "(_cdiv(N, p['BLOCK_X']), _cdiv(M, p['BLOCK_Y']), 1)", "(p['BLOCK_X'], p['BLOCK_Y'], 1)"
    )
    out.append(
        Recipe(
            "matmul/naive",
            "matmul",
            "opencl",
            naive,
            body,
            fargs,
            TunableSpace(
                params={"BLOCK_X": [1, 2, 4, 8, 16, 32], "BLOCK_Y": [1, 2, 4, 8, 16]},
                restrictions=["BLOCK_X * BLOCK_Y <= 256"],
            ),
            {"BLOCK_X": 16, "BLOCK_Y": 16},
            rank=0,
            modules=spec.modules,
            description="one work-item per output, scalar loop",
        )
    )

    # vector widths along N for any N: a work-item whose VW columns run past N computes them one by one
    vws = [2, 4, 8]
    store = (
        "VSTOREV(acc, 0, C + m * N + n0);"
        if not spec.expr and not spec.bias
        else "float r[VW];\n    VSTOREV(acc, 0, r);\n    for (int j = 0; j < VW; ++j) "
        f"C[m * N + n0 + j] = {_epi_call(spec, 'r[j]', 'n0 + j')};"
    )
    if vws:
        vec = f"""{OPENCL_VECTOR_HELPERS}{pre}{_tail_kernel(spec, args)}
__kernel void matmul({args}) {{
    int n0 = get_global_id(0) * VW;
    int m = get_global_id(1);
    if (m >= M || n0 + VW > N) return;  // columns past the last whole vector: matmul_tail
    floatv acc = (floatv)(0.0f);
    for (int k = 0; k < K; ++k) acc += (floatv)(A[m * K + k]) * VLOADV(0, B + k * N + n0);
    {store}
}}
"""
        body, fargs = _forward(
            spec,
            "(_cdiv(NF // p['VW'], p['BLOCK_X']), _cdiv(M, p['BLOCK_Y']), 1)",
            "(p['BLOCK_X'], p['BLOCK_Y'], 1)",
            width="p['VW']",
        )
        out.append(
            Recipe(
                "matmul/vector",
                "matmul",
                "opencl",
                vec,
                body,
                fargs,
                TunableSpace(
                    params={"VW": vws, "BLOCK_X": [1, 2, 4, 8, 16], "BLOCK_Y": [1, 2, 4, 8, 16]},
                    restrictions=["BLOCK_X * BLOCK_Y <= 256"],
                ),
                {"VW": vws[-1], "BLOCK_X": 4, "BLOCK_Y": 4},
                rank=1,
                modules=spec.modules,
                description="vector loads along N, FMA",
            )
        )

        store_rows = (
            "if (m0 + i < M) VSTOREV(acc[i], 0, C + (m0 + i) * N + n0);"
            if not spec.expr and not spec.bias
            else "if (m0 + i < M) { float r[VW]; VSTOREV(acc[i], 0, r); for (int j = 0; j < VW; ++j) "
            f"C[(m0 + i) * N + n0 + j] = {_epi_call(spec, 'r[j]', 'n0 + j')}; }}"
        )
        reg = f"""{OPENCL_VECTOR_HELPERS}{pre}{_tail_kernel(spec, args)}
__kernel void matmul({args}) {{
    int n0 = get_global_id(0) * VW;
    int m0 = get_global_id(1) * TM;
    if (n0 + VW > N || m0 >= M) return;  // columns past the last whole vector: matmul_tail
    floatv acc[TM];
    #pragma unroll
    for (int i = 0; i < TM; ++i) acc[i] = (floatv)(0.0f);
    for (int k = 0; k < K; ++k) {{
        floatv b = VLOADV(0, B + k * N + n0);
        #pragma unroll
        for (int i = 0; i < TM; ++i) acc[i] += (floatv)(A[min(m0 + i, M - 1) * K + k]) * b;
    }}
    #pragma unroll
    for (int i = 0; i < TM; ++i) {{
        {store_rows}
    }}
}}
"""
        body, fargs = _forward(
            spec,
            "(_cdiv(NF // p['VW'], p['BLOCK_X']), _cdiv(_cdiv(M, p['TM']), p['BLOCK_Y']), 1)",
            "(p['BLOCK_X'], p['BLOCK_Y'], 1)",
            width="p['VW']",
        )
        out.append(
            Recipe(
                "matmul/register_block",
                "matmul",
                "opencl",
                reg,
                body,
                fargs,
                TunableSpace(
                    params={
                        "VW": vws,
                        "TM": [1, 2, 4, 8, 16],
                        "BLOCK_X": [1, 2, 4, 8],
                        "BLOCK_Y": [1, 2, 4, 8],
                    },
                    restrictions=["BLOCK_X * BLOCK_Y <= 256", "TM * VW <= 128"],
                ),
                {"VW": vws[-1], "TM": 8, "BLOCK_X": 8, "BLOCK_Y": 1},
                rank=3,
                modules=spec.modules,
                description="each work-item keeps a TM x VW block of C in vector registers",
            )
        )
        out.append(_register_block_2d(spec, pre, args, vws))

    tiled = f"""{pre}
__kernel void matmul({args}) {{
    __local float As[TS][TS];
    __local float Bs[TS][TS + 1];
    int lx = get_local_id(0), ly = get_local_id(1);
    int n = get_group_id(0) * TS + lx;
    int m = get_group_id(1) * TS + ly;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TS) {{
        As[ly][lx] = (m < M && t + lx < K) ? A[m * K + t + lx] : 0.0f;
        Bs[ly][lx] = (n < N && t + ly < K) ? B[(t + ly) * N + n] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; ++k) acc += As[ly][k] * Bs[k][lx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    if (m < M && n < N) C[m * N + n] = {_epi_call(spec, "acc", "n")};
}}
"""
    body, fargs = _forward(spec, "(_cdiv(N, p['TS']), _cdiv(M, p['TS']), 1)", "(p['TS'], p['TS'], 1)")
    out.append(
        Recipe(
            "matmul/local_tiles",
            "matmul",
            "opencl",
            tiled,
            body,
            fargs,
            TunableSpace(params={"TS": [4, 8, 16, 32]}, restrictions=["TS * TS <= 1024"]),
            {"TS": 16},
            rank=2,
            modules=spec.modules,
            description="TS x TS tiles of A and B staged in local memory",
        )
    )

    if vws:
        tr = f"""{OPENCL_VECTOR_HELPERS}{pre}
#define WX (BN / VW)
#define WY (BM / TM)
__kernel void matmul({args}) {{
    __local float As[BK][BM];
    __local float Bs[BK][BN];
    int tx = get_local_id(0), ty = get_local_id(1);
    int tid = ty * WX + tx;
    int bm = get_group_id(1) * BM, bn = get_group_id(0) * BN;
    floatv acc[TM];
    #pragma unroll
    for (int i = 0; i < TM; ++i) acc[i] = (floatv)(0.0f);
    for (int k0 = 0; k0 < K; k0 += BK) {{
        for (int e = tid; e < BM * BK; e += WX * WY) {{
            int r = e / BK, kk = e % BK;
            As[kk][r] = (bm + r < M && k0 + kk < K) ? A[(bm + r) * K + k0 + kk] : 0.0f;
        }}
        for (int e = tid; e < BK * BN; e += WX * WY) {{
            int kk = e / BN, c = e % BN;
            Bs[kk][c] = (k0 + kk < K && bn + c < N) ? B[(k0 + kk) * N + bn + c] : 0.0f;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int kk = 0; kk < BK; ++kk) {{
            floatv b = VLOADV(0, &Bs[kk][tx * VW]);
            #pragma unroll
            for (int i = 0; i < TM; ++i) acc[i] += (floatv)(As[kk][ty * TM + i]) * b;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    int n0 = bn + tx * VW;
    #pragma unroll
    for (int i = 0; i < TM; ++i) {{
        int m = bm + ty * TM + i;
        float r[VW];
        VSTOREV(acc[i], 0, r);
        for (int j = 0; j < VW; ++j)
            if (m < M && n0 + j < N) C[m * N + n0 + j] = {_epi_call(spec, "r[j]", "n0 + j")};
    }}
}}
"""
        body, fargs = _forward(
            spec, "(_cdiv(N, p['BN']), _cdiv(M, p['BM']), 1)", "(p['BN'] // p['VW'], p['BM'] // p['TM'], 1)"
        )
        out.append(
            Recipe(
                "matmul/tiled_register_block",
                "matmul",
                "opencl",
                tr,
                body,
                fargs,
                TunableSpace(
                    params={
                        "BM": [16, 32, 64],
                        "BN": [16, 32, 64],
                        "BK": [4, 8, 16],
                        "TM": [2, 4, 8],
                        "VW": vws,
                    },
                    restrictions=[
                        "BM % TM == 0",
                        "BN % VW == 0",
                        "(BM // TM) * (BN // VW) <= 256",
                        "(BM + BN) * BK * 4 <= 32768",
                    ],
                ),
                {"BM": 32, "BN": 32, "BK": 8, "TM": 4, "VW": vws[-1]},
                rank=4,
                modules=spec.modules,
                description="BM x BN block per work-group via local-memory tiles, TM x VW per work-item",
            )
        )
    return out


def _register_block_2d(spec: OpSpec, pre: str, args: str, vws: list[int]) -> Recipe:
    """TM rows x NB vectors of C per work-item: each A value feeds NB vector multiply-adds."""
    store_2d = (
        "if (m0 + i < M && n0 + j * VW < N) VSTOREV(acc[i][j], j, C + (m0 + i) * N + n0);"
        if not spec.expr and not spec.bias
        else "if (m0 + i < M && n0 + j * VW < N) { float r[VW]; VSTOREV(acc[i][j], 0, r); "
        "for (int u = 0; u < VW; ++u) "
        f"C[(m0 + i) * N + n0 + j * VW + u] = {_epi_call(spec, 'r[u]', 'n0 + j * VW + u')}; }}"
    )
    kernel = f"""{OPENCL_VECTOR_HELPERS}{pre}{_tail_kernel(spec, args)}
__kernel void matmul({args}) {{
    int n0 = get_global_id(0) * VW * NB;
    int m0 = get_global_id(1) * TM;
    if (n0 + VW * NB > N || m0 >= M) return;  // columns past the last whole block: matmul_tail
    floatv acc[TM][NB];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < NB; ++j) acc[i][j] = (floatv)(0.0f);
    for (int k = 0; k < K; ++k) {{
        floatv b[NB];
        #pragma unroll
        for (int j = 0; j < NB; ++j) b[j] = VLOADV(j, B + k * N + n0);
        #pragma unroll
        for (int i = 0; i < TM; ++i) {{
            floatv a = (floatv)(A[min(m0 + i, M - 1) * K + k]);
            #pragma unroll
            for (int j = 0; j < NB; ++j) acc[i][j] += a * b[j];
        }}
    }}
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < NB; ++j) {{
            {store_2d}
        }}
}}
"""
    nbs = [1, 2, 3, 4]
    nb0 = 2
    body, fargs = _forward(
        spec,
        "(_cdiv(NF // (p['VW'] * p['NB']), p['BLOCK_X']), _cdiv(_cdiv(M, p['TM']), p['BLOCK_Y']), 1)",
        "(p['BLOCK_X'], p['BLOCK_Y'], 1)",
        width="p['VW'] * p['NB']",
    )
    return Recipe(
        "matmul/register_block_2d",
        "matmul",
        "opencl",
        kernel,
        body,
        fargs,
        TunableSpace(
            params={
                "VW": vws,
                "NB": nbs,
                "TM": [2, 4, 6, 8],
                "BLOCK_X": [1, 2, 4, 8],
                "BLOCK_Y": [1, 2, 4, 8],
            },
            restrictions=["BLOCK_X * BLOCK_Y <= 256", "TM * NB <= 16"],
        ),
        {"VW": vws[-1], "NB": nb0, "TM": 8, "BLOCK_X": 4, "BLOCK_Y": 1},
        rank=5,
        modules=spec.modules,
        description="a TM x (NB*VW) block of C per work-item: each A value feeds NB vector multiply-adds",
    )


def cuda_recipes(spec: OpSpec) -> list[Recipe]:
    out: list[Recipe] = []
    pre = _epilogue(spec, "cuda") + (_CU_TRANSPOSE if spec.linear else "")
    args = _args(spec, "cuda")
    naive = f"""{pre}
extern "C" __global__ void matmul({args}) {{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    int m = blockIdx.y * blockDim.y + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[m * K + k] * B[k * N + n];
    C[m * N + n] = {_epi_call(spec, "acc", "n")};
}}
"""
    body, fargs = _forward(
        spec, "(_cdiv(N, p['BLOCK_X']), _cdiv(M, p['BLOCK_Y']), 1)", "(p['BLOCK_X'], p['BLOCK_Y'], 1)"
    )
    out.append(
        Recipe(
            "matmul/naive",
            "matmul",
            "cuda",
            naive,
            body,
            fargs,
            TunableSpace(
                params={"BLOCK_X": [8, 16, 32, 64], "BLOCK_Y": [1, 2, 4, 8, 16]},
                restrictions=["BLOCK_X * BLOCK_Y <= 1024"],
            ),
            {"BLOCK_X": 16, "BLOCK_Y": 16},
            rank=0,
            modules=spec.modules,
            description="one thread per output",
        )
    )
    if True:  # float4 loads of B where N % 4 == 0 and B, C are 16-byte aligned; matmul_scalar elsewhere
        scalar = naive.replace("void matmul(", "void matmul_scalar(")
        vec = f"""{scalar}
extern "C" __global__ void matmul({args}) {{
    int n0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    int m = blockIdx.y * blockDim.y + threadIdx.y;
    if (m >= M || n0 >= N) return;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < K; ++k) {{
        float a = __ldg(&A[m * K + k]);
        float4 b = __ldg(reinterpret_cast<const float4*>(B + k * N + n0));
        acc.x = fmaf(a, b.x, acc.x); acc.y = fmaf(a, b.y, acc.y);
        acc.z = fmaf(a, b.z, acc.z); acc.w = fmaf(a, b.w, acc.w);
    }}
    float4 r = make_float4({_epi_call(spec, "acc.x", "n0")}, {_epi_call(spec, "acc.y", "n0 + 1")},
                           {_epi_call(spec, "acc.z", "n0 + 2")}, {_epi_call(spec, "acc.w", "n0 + 3")});
    *reinterpret_cast<float4*>(C + m * N + n0) = r;
}}
"""
        body, fargs = _forward(
            spec,
            "(_cdiv(N // 4, p['BLOCK_X']), _cdiv(M, p['BLOCK_Y']), 1)",
            "(p['BLOCK_X'], p['BLOCK_Y'], 1)",
            fallback=("matmul_scalar", "(_cdiv(N, p['BLOCK_X']), _cdiv(M, p['BLOCK_Y']), 1)", "N % 4 == 0"),
        )
        out.append(
            Recipe(
                "matmul/vector",
                "matmul",
                "cuda",
                vec,
                body,
                fargs,
                TunableSpace(
                    params={"BLOCK_X": [8, 16, 32, 64], "BLOCK_Y": [1, 2, 4, 8, 16]},
                    restrictions=["BLOCK_X * BLOCK_Y <= 1024"],
                ),
                {"BLOCK_X": 32, "BLOCK_Y": 8},
                rank=1,
                modules=spec.modules,
                description="float4 loads of B, FMA",
            )
        )
    tiled = f"""{pre}
extern "C" __global__ void matmul({args}) {{
    __shared__ float As[TS][TS];
    __shared__ float Bs[TS][TS + 1];
    int lx = threadIdx.x, ly = threadIdx.y;
    int n = blockIdx.x * TS + lx;
    int m = blockIdx.y * TS + ly;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TS) {{
        As[ly][lx] = (m < M && t + lx < K) ? A[m * K + t + lx] : 0.0f;
        Bs[ly][lx] = (n < N && t + ly < K) ? B[(t + ly) * N + n] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TS; ++k) acc = fmaf(As[ly][k], Bs[k][lx], acc);
        __syncthreads();
    }}
    if (m < M && n < N) C[m * N + n] = {_epi_call(spec, "acc", "n")};
}}
"""
    body, fargs = _forward(spec, "(_cdiv(N, p['TS']), _cdiv(M, p['TS']), 1)", "(p['TS'], p['TS'], 1)")
    out.append(
        Recipe(
            "matmul/shared_tiles",
            "matmul",
            "cuda",
            tiled,
            body,
            fargs,
            TunableSpace(params={"TS": [8, 16, 32]}),
            {"TS": 16},
            rank=2,
            modules=spec.modules,
            description="TS x TS tiles in shared memory",
        )
    )
    reg = f"""{pre}
extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN))
matmul({args}) {{
    __shared__ float As[2][BK][BM];
    __shared__ float Bs[2][BK][BN];
    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    const int nthreads = (BM / TM) * (BN / TN);
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    int buf = 0;
    // double buffer: tile k0 + BK is loaded while tile k0 is multiplied
    for (int e = threadIdx.x; e < BM * BK; e += nthreads) {{
        int r = e / BK, kk = e % BK;
        As[0][kk][r] = (bm + r < M && kk < K) ? A[(bm + r) * K + kk] : 0.0f;
    }}
    for (int e = threadIdx.x; e < BK * BN; e += nthreads) {{
        int kk = e / BN, c = e % BN;
        Bs[0][kk][c] = (kk < K && bn + c < N) ? B[kk * N + bn + c] : 0.0f;
    }}
    __syncthreads();
    for (int k0 = 0; k0 < K; k0 += BK) {{
        int nk = k0 + BK;
        if (nk < K) {{
            for (int e = threadIdx.x; e < BM * BK; e += nthreads) {{
                int r = e / BK, kk = e % BK;
                As[buf ^ 1][kk][r] = (bm + r < M && nk + kk < K) ? A[(bm + r) * K + nk + kk] : 0.0f;
            }}
            for (int e = threadIdx.x; e < BK * BN; e += nthreads) {{
                int kk = e / BN, c = e % BN;
                Bs[buf ^ 1][kk][c] = (nk + kk < K && bn + c < N) ? B[(nk + kk) * N + bn + c] : 0.0f;
            }}
        }}
        #pragma unroll
        for (int kk = 0; kk < BK; ++kk) {{
            float a[TM], b[TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[buf][kk][ty * TM + i];
            #pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[buf][kk][tx * TN + j];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }}
        __syncthreads();
        buf ^= 1;
    }}
    #pragma unroll
    for (int i = 0; i < TM; ++i) {{
        int m = bm + ty * TM + i;
        #pragma unroll
        for (int j = 0; j < TN; ++j) {{
            int n = bn + tx * TN + j;
            if (m < M && n < N) C[m * N + n] = {_epi_call(spec, "acc[i][j]", "n")};
        }}
    }}
}}
"""
    body, fargs = _forward(
        spec,
        "(_cdiv(N, p['BN']), _cdiv(M, p['BM']), 1)",
        "((p['BM'] // p['TM']) * (p['BN'] // p['TN']), 1, 1)",
    )
    out.append(
        Recipe(
            "matmul/register_block_double_buffer",
            "matmul",
            "cuda",
            reg,
            body,
            fargs,
            TunableSpace(
                params={
                    "BM": [32, 64, 128],
                    "BN": [32, 64, 128],
                    "BK": [8, 16, 32],
                    "TM": [4, 8],
                    "TN": [4, 8],
                },
                restrictions=[
                    "(BM // TM) * (BN // TN) <= 1024",
                    "(BM // TM) * (BN // TN) >= 32",
                    "2 * (BM + BN) * BK * 4 <= 49152",
                ],
            ),
            {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4},
            rank=4,
            modules=spec.modules,
            description="BM x BN tile per block, TM x TN per thread in registers, double-buffered shared tiles",
        )
    )
    if spec.M >= 16 and spec.N >= 16:  # any shape; zero-filled past M, N, K
        head = _forward(spec, "(1, 1, 1)", "(1, 1, 1)")[0].split("\nself.prog.matmul(")[0]
        out.append(sgemm_async(spec, pre, head))
        out.append(sgemm_warp(spec, pre, head))
    if spec.M >= 128 and spec.N >= 128:  # at least a 128 x 128 tile at the traced shape
        out.append(_sgemm_128(spec, pre, args, tiled))
        if spec.M * spec.N <= 64 * 128 * 128 and spec.K >= 2048:  # few tiles, long K
            out.append(_sgemm_splitk(spec, pre, args, tiled))
    if spec.N <= 8:  # skinny products (matrix-vector): a block per output
        out.append(_gemv_block(spec, pre, args))
    warp = f"""{pre}
extern "C" __global__ void matmul({args}) {{
    // one warp per (row, TN-column strip): lanes split K, partial sums meet through warp shuffles
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int strips = (N + TN - 1) / TN;
    const int m = warp / strips, n0 = (warp % strips) * TN;
    if (m >= M) return;
    float acc[TN];
    #pragma unroll
    for (int j = 0; j < TN; ++j) acc[j] = 0.0f;
    for (int k = lane; k < K; k += 32) {{
        float a = __ldg(&A[m * K + k]);
        #pragma unroll
        for (int j = 0; j < TN; ++j) if (n0 + j < N) acc[j] = fmaf(a, __ldg(&B[k * N + n0 + j]), acc[j]);
    }}
    #pragma unroll
    for (int j = 0; j < TN; ++j) {{
        float v = acc[j];
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && n0 + j < N) C[m * N + n0 + j] = {_epi_call(spec, "v", "n0 + j")};
    }}
}}
"""
    body, fargs = _forward(
        spec, "(_cdiv(M * _cdiv(N, p['TN']) * 32, p['BLOCK_X']), 1, 1)", "(p['BLOCK_X'], 1, 1)"
    )
    out.append(
        Recipe(
            "matmul/warp_split_k",
            "matmul",
            "cuda",
            warp,
            body,
            fargs,
            TunableSpace(params={"TN": [1, 2, 4, 8, 16], "BLOCK_X": [64, 128, 256]}),
            {"TN": 8, "BLOCK_X": 128},
            rank=1,
            modules=spec.modules,
            description="a warp per output strip, K split across lanes, warp-shuffle reduction (skinny shapes)",
        )
    )
    return out


#: The main loop of the 128x128x8 kernels over K in [k_begin, k_begin + k_len) (both defined before it):
#: leaves acc[8][8] for rows bm + {ty*4, 64 + ty*4} + 0..3 and columns bn + {tx*4, 64 + tx*4} + 0..3.
_SGEMM_BODY = """    __shared__ __align__(16) float As[2][8][128 + 4];
    __shared__ __align__(16) float Bs[2][8][128];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int aRow = tid >> 1, aCol = (tid & 1) * 4;
    const int bRow = tid >> 5, bCol = (tid & 31) * 4;
    const int bm = blockIdx.y * 128, bn = blockIdx.x * 128;
    const float* Ap = A + (size_t)(bm + aRow) * K + k_begin + aCol;
    const float* Bp = B + (size_t)(k_begin + bRow) * N + bn + bCol;
    float acc[8][8];
    #pragma unroll
    for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    float4 ga = __ldg(reinterpret_cast<const float4*>(Ap));
    float4 gb = __ldg(reinterpret_cast<const float4*>(Bp));
    As[0][aCol + 0][aRow] = ga.x; As[0][aCol + 1][aRow] = ga.y; As[0][aCol + 2][aRow] = ga.z; As[0][aCol + 3][aRow] = ga.w;
    *reinterpret_cast<float4*>(&Bs[0][bRow][bCol]) = gb;
    __syncthreads();
    int cur = 0;
    for (int k0 = 0; k0 < k_len; k0 += 8) {
        const bool more = k0 + 8 < k_len;
        if (more) {
            ga = __ldg(reinterpret_cast<const float4*>(Ap + k0 + 8));
            gb = __ldg(reinterpret_cast<const float4*>(Bp + (size_t)(k0 + 8) * N));
        }
        #pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[cur][kk][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][kk][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][kk][64 + tx * 4]);
            const float ra[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float rb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
        }
        if (more) {
            const int nxt = cur ^ 1;
            As[nxt][aCol + 0][aRow] = ga.x; As[nxt][aCol + 1][aRow] = ga.y;
            As[nxt][aCol + 2][aRow] = ga.z; As[nxt][aCol + 3][aRow] = ga.w;
            *reinterpret_cast<float4*>(&Bs[nxt][bRow][bCol]) = gb;
        }
        __syncthreads();
        cur ^= 1;
    }"""


def _sgemm_splitk(spec: OpSpec, pre: str, args: str, tiled: str) -> Recipe:
    """:func:`_sgemm_128` with K split across SPLIT blocks per tile (grid z, SPLIT chosen in forward for
    about two tiles per SM): each writes its partial tile to a workspace, a second kernel adds the SPLIT
    partials of each output in order and applies the epilogue. For few tiles and a long K."""
    fallback = tiled.replace("void matmul(", "void matmul_tiles(").replace("TS", "16")
    bias = "const float* __restrict__ bias, " if spec.bias else ""
    kernel = f"""{fallback}
extern "C" __global__ void __launch_bounds__(256, 2) matmul_part(const float* __restrict__ A, const float* __restrict__ B,
                                                                  float* __restrict__ W, int M, int N, int K, int kc) {{
    const int k_begin = blockIdx.z * kc, k_len = min(K - k_begin, kc);
{_SGEMM_BODY}
    float* Wz = W + (size_t)blockIdx.z * M * N;
    #pragma unroll
    for (int i = 0; i < 8; ++i) {{
        const int m = bm + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const int n = bn + h * 64 + tx * 4;
            *reinterpret_cast<float4*>(Wz + (size_t)m * N + n) =
                make_float4(acc[i][h * 4 + 0], acc[i][h * 4 + 1], acc[i][h * 4 + 2], acc[i][h * 4 + 3]);
        }}
    }}
}}

extern "C" __global__ void matmul_sum(const float* __restrict__ W, {bias}float* __restrict__ C, int M, int N, int split) {{
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)M * N) return;
    const int n = (int)(e % N);
    float v = 0.0f;
    for (int z = 0; z < split; ++z) v += __ldg(W + (size_t)z * M * N + e);
    C[e] = {_epi_call(spec, "v", "n")};
}}
"""
    a, b = ("x", "wt") if spec.linear else ("a", "b")
    bias_arg = "self.m0.bias, " if spec.bias else ""
    head = _forward(spec, "(1, 1, 1)", "(1, 1, 1)")[0].split("\nself.prog.matmul(")[0]
    forward = f"""{head}
tiles = (M // 128) * (N // 128)
if tiles and M % 128 == 0 and N % 128 == 0 and K % 8 == 0 and _aligned({a}, {b}, c):
    split = max(1, min(64, 2 * 132 // tiles, K // 256))
    kc = _cdiv(_cdiv(K, split), 8) * 8
    split = _cdiv(K, kc)
    w = torch.empty((split, M, N), dtype=c.dtype, device=c.device)
    self.prog.matmul_part({a}, {b}, w, M, N, K, kc, grid=(N // 128, M // 128, split), block=(256, 1, 1))
    self.prog.matmul_sum(w, {bias_arg}c, M, N, split, grid=(_cdiv(M * N, p['BLOCK_X']), 1, 1), block=(p['BLOCK_X'], 1, 1))
else:
    self.prog.matmul_tiles({a}, {b}, {bias_arg}c, M, N, K, grid=(_cdiv(N, 16), _cdiv(M, 16), 1), block=(16, 16, 1))
return c
"""
    return Recipe(
        "matmul/sgemm_128x128_split_k",
        "matmul",
        "cuda",
        kernel,
        forward,
        ["x"] if spec.linear else ["a", "b"],
        TunableSpace(params={"BLOCK_X": [128, 256, 512]}),
        {"BLOCK_X": 256},
        rank=5,
        modules=spec.modules,
        description="the 128x128x8 kernel with K split across blocks (few tiles, long K), partials added in order",
    )


def _sgemm_128(spec: OpSpec, pre: str, args: str, tiled: str) -> Recipe:
    """128 x 128 x 8 tiles, 8 x 8 outputs per thread as four 4 x 4 quadrants 64 apart (conflict-free
    float4 shared reads), A transposed into padded shared memory, both tiles double-buffered with the
    next tile's float4 global loads in registers during the current tile's FMAs. Shapes that do not
    tile (M, N % 128, K % 8, or unaligned rows) run the shared-tile kernel of the same program."""
    fallback = tiled.replace("void matmul(", "void matmul_tiles(").replace("TS", "16")
    kernel = f"""{fallback}
extern "C" __global__ void __launch_bounds__(256, MINB) matmul({args}) {{
    const int k_begin = 0, k_len = K;
{_SGEMM_BODY}
    #pragma unroll
    for (int i = 0; i < 8; ++i) {{
        const int m = bm + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const int n = bn + h * 64 + tx * 4;
            float4 r;
            r.x = {_epi_call(spec, "acc[i][h * 4 + 0]", "n")};
            r.y = {_epi_call(spec, "acc[i][h * 4 + 1]", "n + 1")};
            r.z = {_epi_call(spec, "acc[i][h * 4 + 2]", "n + 2")};
            r.w = {_epi_call(spec, "acc[i][h * 4 + 3]", "n + 3")};
            *reinterpret_cast<float4*>(C + (size_t)m * N + n) = r;
        }}
    }}
}}
"""
    a = "x" if spec.linear else "a"
    body, fargs = _forward(
        spec,
        "(N // 128, M // 128, 1)",
        "(256, 1, 1)",
        fallback=(
            "matmul_tiles",
            "(_cdiv(N, 16), _cdiv(M, 16), 1)",
            f"M % 128 == 0 and N % 128 == 0 and K % 8 == 0 and _aligned({a})",
        ),
    )
    # the fallback launches with the main kernel's block: (256, 1, 1) is 16 x 16 flattened there
    body = body.replace(
        "grid=(_cdiv(N, 16), _cdiv(M, 16), 1), block=(256, 1, 1)",
        "grid=(_cdiv(N, 16), _cdiv(M, 16), 1), block=(16, 16, 1)",
    )
    return Recipe(
        "matmul/sgemm_128x128",
        "matmul",
        "cuda",
        kernel,
        body,
        fargs,
        TunableSpace(params={"MINB": [1, 2]}),
        {"MINB": 2},
        rank=5,
        modules=spec.modules,
        description="128x128x8 tiles, 8x8 per thread in conflict-free quadrants, double-buffered shared "
        "memory with register-staged float4 global loads",
    )


def _gemv_block(spec: OpSpec, pre: str, args: str) -> Recipe:
    """A block per output C[m, n] (grid-stride over the outputs): the threads stride K, UNROLL float4
    loads of A's row (and of B when N == 1) in flight per thread, a partial sum per 4 * UNROLL * 4
    terms of each thread, then warp shuffles and shared memory across the block. float4 where K % 4 == 0
    and A, B are 16-byte aligned (checked in the kernel), scalar otherwise."""
    kernel = f"""{pre}
#define NWARPS (BLOCK_X / 32)
extern "C" __global__ void __launch_bounds__(BLOCK_X) matmul({args}) {{
    __shared__ float part[NWARPS];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const bool vec = N == 1 && (K & 3) == 0 && (reinterpret_cast<size_t>(A) & 15) == 0
                     && (reinterpret_cast<size_t>(B) & 15) == 0;
    for (long long o = blockIdx.x; o < (long long)M * N; o += gridDim.x) {{
        const int m = (int)(o / N), n = (int)(o % N);
        const float* a = A + (size_t)m * K;
        float total = 0.0f;
        if (vec) {{
            const float4* a4 = reinterpret_cast<const float4*>(a);
            const float4* b4 = reinterpret_cast<const float4*>(B);
            const int K4 = K >> 2, span = BLOCK_X * UNROLL * 4;
            for (int c0 = 0; c0 < K4; c0 += span) {{
                const int c1 = min(K4, c0 + span);
                float chunk = 0.0f;
                int c = c0 + t;
                for (; c + (UNROLL - 1) * BLOCK_X < c1; c += BLOCK_X * UNROLL) {{  // UNROLL loads in flight
                    float4 x[UNROLL], y[UNROLL];
                    #pragma unroll
                    for (int u = 0; u < UNROLL; ++u) {{ x[u] = __ldg(a4 + c + u * BLOCK_X); y[u] = __ldg(b4 + c + u * BLOCK_X); }}
                    #pragma unroll
                    for (int u = 0; u < UNROLL; ++u) {{
                        chunk = fmaf(x[u].x, y[u].x, chunk); chunk = fmaf(x[u].y, y[u].y, chunk);
                        chunk = fmaf(x[u].z, y[u].z, chunk); chunk = fmaf(x[u].w, y[u].w, chunk);
                    }}
                }}
                for (; c < c1; c += BLOCK_X) {{
                    const float4 x = __ldg(a4 + c), y = __ldg(b4 + c);
                    chunk = fmaf(x.x, y.x, chunk); chunk = fmaf(x.y, y.y, chunk);
                    chunk = fmaf(x.z, y.z, chunk); chunk = fmaf(x.w, y.w, chunk);
                }}
                total += chunk;
            }}
        }} else {{
            for (int k0 = 0; k0 < K; k0 += BLOCK_X * 64) {{
                const int k1 = min(K, k0 + BLOCK_X * 64);
                float chunk = 0.0f;
                for (int k = k0 + t; k < k1; k += BLOCK_X) chunk = fmaf(__ldg(a + k), __ldg(B + (size_t)k * N + n), chunk);
                total += chunk;
            }}
        }}
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
        if (lane == 0) part[warp] = total;
        __syncthreads();
        if (warp == 0) {{
            total = lane < NWARPS ? part[lane] : 0.0f;
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
            if (lane == 0) C[(size_t)m * N + n] = {_epi_call(spec, "total", "n")};
        }}
        __syncthreads();
    }}
}}
"""
    body, fargs = _forward(spec, "(max(1, min(M * N, 65535)), 1, 1)", "(p['BLOCK_X'], 1, 1)")
    return Recipe(
        "matmul/gemv_block",
        "matmul",
        "cuda",
        kernel,
        body,
        fargs,
        TunableSpace(params={"BLOCK_X": [128, 256, 512], "UNROLL": [2, 4]}),
        {"BLOCK_X": 256, "UNROLL": 4},
        rank=3,
        modules=spec.modules,
        description="a block per output: float4 loads of A's row, UNROLL in flight per thread, chunked "
        "partial sums, warp-shuffle and shared-memory merge",
    )


def recipes(spec: OpSpec, language: str) -> list[Recipe]:
    if spec.family == "gemm":  # batched / transposed / triangular / diagonal products (.recognize_mm)
        from kfoundry.plugins.llms.offline import cookbook_mm_variants

        return adapt(cookbook_mm_variants.recipes(spec, language, _epilogue(spec, language)), spec)
    if spec.dtype != "float32":  # fp16 / bf16: fp32 accumulation, tensor cores on CUDA
        build = cookbook_hgemm.opencl_recipes if language == "opencl" else cookbook_hgemm.cuda_recipes
        return adapt(build(spec, _epilogue(spec, language), "epilogue({v}, {n})"), spec)
    return adapt(opencl_recipes(spec) if language == "opencl" else cuda_recipes(spec), spec)
