"""CUDA row recipes whose second look at a row stays on chip (issue 13: the two-pass row ops at one pass).

``<family>/onchip_split`` (softmax, log-softmax, layer norm, RMS norm over the last dims): a long row is
cut into K chunks of ``BLOCK * (V + S)`` float4, one block per chunk. A block loads its chunk once from
DRAM into registers (V float4 per thread, all V loads in flight) and shared memory (S float4 per thread,
staged through the same registers), folds it into partial statistics, publishes them to a global
workspace and bumps its row's arrival counter; once all K blocks of the row have arrived it merges the K
partials (the same order in every block, so every block of a row gets the same statistics) and writes its
chunk from registers and shared memory. Each byte is read once and written once.

The blocks of one row wait for each other, so they must be resident together. A block takes its chunk
from a global ticket (an atomic counter), not from ``blockIdx``: a block holds ticket t only once every
block with a smaller ticket has started, so the oldest row that is not complete always has all its
started blocks resident and its missing ones are next in line; with K <= the blocks resident at once
(``MINB`` per SM, forced by ``__launch_bounds__(BLOCK, MINB)`` for registers and checked for shared
memory and threads) no wait can deadlock. ``forward`` checks that bound with the device's SM count and
otherwise (another shape, a smaller GPU) runs the plain kernel in the same program: a block per row, two
passes from global memory. Rows whose length is not a multiple of 4 or unaligned data take scalar loads
in the same chunked kernel; a last chunk shorter than the rest is guarded.

Index arithmetic: row offsets are 64-bit (``row * R`` exceeds 2^31 for large tensors); positions inside a
row are 32-bit (a row has fewer than 2^31 elements, and ``forward`` refuses more than 2^31 - 1 tickets).
The recipe is written 64-bit safe and says ``index64`` so :func:`index_width.adapt` leaves it alone.

Measured on the H200 (benchmarks/kernelbench.py --sweep BLOCK,MINB, 2026-12-02, copy 4.02 TB/s): correct,
but slower than the recipes it was meant to beat. Softmax 4096 x 393216: 5.53 ms at its best chunked
setting (BLOCK 128, MINB 8; 5.61 at 256 x 4) against cluster_stream 4.76 and split_rows_vec 4.84 (the
plain fallback kernel alone reads 5.34). Layer norm 16 x 4M with weight and bias: 0.344 ms (BLOCK 512,
MINB 2; 0.352 at 256 x 4) against split_rows_vec 0.298. The chunks of a row wait for the row's slowest
block while only about one (layer norm) to eleven (softmax) rows fit on chip, so the load and store phases
of the resident blocks do not overlap enough; hence rank 2, below cluster_stream and split_rows_vec.

Loads of x are streaming (``__ldcs``, evict-first: read once) and the output stores too (``__stcs``), so
neither pushes layer norm's weight and bias (re-read for every row) out of L2; those load with an
evict-last policy where ``HINT`` is 1.
"""

from __future__ import annotations

from kfoundry.core.models import ParamValue, TunableSpace
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec
from kfoundry.plugins.llms.offline.rowops import RowOp, row_op

#: Families this recipe handles (rows along the last dims, one output element per input element).
FAMILIES = ("softmax", "log_softmax", "layer_norm", "rms_norm")

#: The SM count assumed when the recipe is chosen and ranked (the H200's); ``forward`` reads the device's.
SMS = 132

#: Rows shorter than this many float4 are left to the block- and cluster-per-row recipes.
MIN_ROW4 = 4096

_HELPERS = r"""
// evict-last loads (sm_80+: an L2 cache policy) for data re-read by later rows (layer norm's weight, bias)
static __device__ __forceinline__ float4 kf_ld_last(const float4* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float4 v;
    asm volatile("{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
                 "ld.global.nc.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], pol; }"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
#else
    return __ldg(p);
#endif
}
static __device__ __forceinline__ float kf_ld_last1(const float* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float v;
    asm volatile("{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
                 "ld.global.nc.L2::cache_hint.f32 %0, [%1], pol; }" : "=f"(v) : "l"(p));
    return v;
#else
    return __ldg(p);
#endif
}
#if HINT
#define KF_LDX4(p) __ldcs(p)
#define KF_LDX(p) __ldcs(p)
#define KF_STY4(p, v) __stcs(p, v)
#define KF_STY(p, v) __stcs(p, v)
#define KF_LDW4(p) kf_ld_last(p)
#define KF_LDW(p) kf_ld_last1(p)
#else
#define KF_LDX4(p) __ldg(p)
#define KF_LDX(p) __ldg(p)
#define KF_STY4(p, v) (*(p) = (v))
#define KF_STY(p, v) (*(p) = (v))
#define KF_LDW4(p) __ldg(p)
#define KF_LDW(p) __ldg(p)
#endif
"""


def _block_reduce(op: RowOp, tag: str) -> str:
    """C statements merging every thread's statistics into every thread's (warp shuffles, then the warps'
    partials through ``sh_<stat>`` in shared memory, then a broadcast through slot 32)."""
    names = [n for n, _ in op.stats]
    shfl = " ".join(f"float {n}_o = __shfl_xor_sync(0xffffffffu, {n}, off);" for n in names)
    save = " ".join(f"sh_{n}[warp] = {n};" for n in names)
    load = " ".join(f"{n} = lane < NWARPS ? sh_{n}[lane] : {init};" for n, init in op.stats)
    bcast = " ".join(f"sh_{n}[32] = {n};" for n in names)
    get = " ".join(f"{n} = sh_{n}[32];" for n in names)
    return f"""
    // block merge ({tag})
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
    __syncthreads();  // the previous use of sh_ is over
    if (lane == 0) {{ {save} }}
    __syncthreads();
    if (warp == 0) {{
        {load}
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
        if (lane == 0) {{ {bcast} }}
    }}
    __syncthreads();
    {get}"""


def _out4(op: RowOp, affine: bool) -> str:
    """The float4 ``q`` at float4 position ``c`` of the row turned into output, in place (vector path)."""
    parts = []
    for k, comp in enumerate("xyzw"):
        expr = op.out
        if affine:
            expr = expr.replace("w[j]", f"wq.{comp}").replace("b[j]", f"bq.{comp}")
        parts.append(f"{{ float x = q.{comp}; const int j = 4 * c + {k}; (void)j; q.{comp} = {expr}; }}")
    wb = (
        "const float4 wq = KF_LDW4(reinterpret_cast<const float4*>(w) + c); "
        "const float4 bq = KF_LDW4(reinterpret_cast<const float4*>(b) + c); "
        if affine
        else ""
    )
    return wb + " ".join(parts)


def _out1(op: RowOp, affine: bool) -> str:
    """The scalar ``x`` at row position ``j`` turned into output (the scalar path)."""
    expr = op.out
    if affine:
        expr = expr.replace("w[j]", "KF_LDW(w + j)").replace("b[j]", "KF_LDW(b + j)")
    return expr


def kernel_source(spec: OpSpec) -> str:
    """The CUDA program: ``rows`` (the chunked, on-chip kernel) and ``rows_plain`` (its fallback)."""
    op = row_op(spec, "cuda")
    names = [n for n, _ in op.stats]
    ns = len(names)
    c = "const float* __restrict__"
    wb = f"{c} w, {c} b, " if spec.affine else ""
    shared = "\n    ".join(f"__shared__ float sh_{n}[33];" for n in names)
    put = " ".join(
        f"P[((size_t)row * (size_t)K + (size_t)part) * {ns} + {i}] = {n};" for i, n in enumerate(names)
    )
    get = " ".join(
        f"float {n}_o = __ldcg(P + ((size_t)row * (size_t)K + (size_t)q) * {ns} + {i});"
        for i, n in enumerate(names)
    )
    acc1 = op.acc
    fold_tail = (
        "{ const int e = 4 * c; float x; "
        f"if (e < R) {{ x = q.x; {acc1} }} if (e + 1 < R) {{ x = q.y; {acc1} }} "
        f"if (e + 2 < R) {{ x = q.z; {acc1} }} if (e + 3 < R) {{ x = q.w; {acc1} }} }}"
    )
    fold = f"if (vec4 || 4 * c + 3 < R) {{ {op.acc4} }} else {fold_tail}"
    load_s = (
        "{ const int e = 4 * c; q.x = e < R ? KF_LDX(xr + e) : 0.0f; q.y = e + 1 < R ? KF_LDX(xr + e + 1) : 0.0f; "
        "q.z = e + 2 < R ? KF_LDX(xr + e + 2) : 0.0f; q.w = e + 3 < R ? KF_LDX(xr + e + 3) : 0.0f; }"
    )
    load = f"if (vec4) q = KF_LDX4(xr4 + c); else {load_s}"
    o1 = _out1(op, spec.affine)
    store_s = (
        "{ const int e = 4 * c; "
        + " ".join(
            f"if (e + {k} < R) {{ float x = q.{comp}; const int j = e + {k}; KF_STY(yr + j, {o1}); }}"
            for k, comp in enumerate("xyzw")
        )
        + " }"
    )
    store = f"if (vec4) {{ {_out4(op, spec.affine)} KF_STY4(yr4 + c, q); }} else {store_s}"
    return f"""
// BLOCK (threads), V (float4 per thread in registers), S (float4 per thread in shared memory), MINB (blocks
// per SM the registers are capped for) and HINT (cache policies) are defined when the program is built
{_HELPERS}
#define NWARPS (BLOCK / 32)
#define CH4 (BLOCK * (V + S))
extern "C" __global__ void __launch_bounds__(BLOCK, MINB) rows({c} X, {wb}float* __restrict__ Y,
        float* __restrict__ P, int* __restrict__ sync, int outer, int R, int K, int vec4) {{
    // sync[0]: the ticket; sync[1 + row]: the blocks of the row that have published their partials
    extern __shared__ float4 kf_cache[];
    {shared}
    __shared__ int sh_ticket;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) sh_ticket = atomicAdd(sync, 1);
    __syncthreads();
    const int ticket = sh_ticket;
    const int row = ticket / K, part = ticket - row * K;
    const int n4 = vec4 ? (R >> 2) : ((R + 3) >> 2);  // float4 slots of the row (the last one partial)
    const int c0 = part * CH4 + (int)threadIdx.x;
    const float* xr = X + (size_t)row * (size_t)R;
    float* yr = Y + (size_t)row * (size_t)R;
    const float4* xr4 = reinterpret_cast<const float4*>(xr);
    float4* yr4 = reinterpret_cast<float4*>(yr);
    (void)xr4; (void)yr4;
    {op.declare()}
    float4 v[V];
    // the shared-memory part first, V loads in flight, staged through v
    #pragma unroll
    for (int s0 = 0; s0 < S; s0 += V) {{
        #pragma unroll
        for (int u = 0; u < V; ++u) {{
            const int c = c0 + (V + s0 + u) * BLOCK;
            if (s0 + u < S && c < n4) {{ float4 q; {load} v[u] = q; }}
        }}
        #pragma unroll
        for (int u = 0; u < V; ++u) {{
            const int c = c0 + (V + s0 + u) * BLOCK;
            if (s0 + u < S && c < n4) {{ const float4 q = v[u]; kf_cache[(s0 + u) * BLOCK + threadIdx.x] = q; {fold} }}
        }}
    }}
    // then the register part: V loads in flight
    #pragma unroll
    for (int u = 0; u < V; ++u) {{
        const int c = c0 + u * BLOCK;
        if (c < n4) {{ float4 q; {load} v[u] = q; }}
    }}
    #pragma unroll
    for (int u = 0; u < V; ++u) {{
        const int c = c0 + u * BLOCK;
        if (c < n4) {{ const float4 q = v[u]; {fold} }}
    }}
    {_block_reduce(op, "the chunk's partial statistics")}
    if (threadIdx.x == 0) {{
        {put}
        __threadfence();  // the partials before the arrival
        atomicAdd(sync + 1 + row, 1);
        volatile const int* arrived = sync + 1 + row;
        while (*arrived < K) __nanosleep(32);
        __threadfence();  // the others' partials after their arrivals
    }}
    __syncthreads();
    {{
        {op.declare()}
        for (int q = threadIdx.x; q < K; q += BLOCK) {{ {get} {op.merge} }}
        {_block_reduce(op, "the row's statistics from its K partials")}
        {op.final}
        #pragma unroll
        for (int u = 0; u < V; ++u) {{
            const int c = c0 + u * BLOCK;
            if (c < n4) {{ float4 q = v[u]; {store} }}
        }}
        #pragma unroll
        for (int s = 0; s < S; ++s) {{
            const int c = c0 + (V + s) * BLOCK;
            if (c < n4) {{ float4 q = kf_cache[s * BLOCK + threadIdx.x]; {store} }}
        }}
    }}
}}

extern "C" __global__ void __launch_bounds__(BLOCK) rows_plain({c} X, {wb}float* __restrict__ Y, int outer, int R) {{
    // the fallback: a block per row, the statistics in one pass over global memory, then the output
    {shared}
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x;
    const float* xr = X + (size_t)row * (size_t)R;
    float* yr = Y + (size_t)row * (size_t)R;
    {op.declare()}
    for (int r = threadIdx.x; r < R; r += BLOCK) {{ float x = __ldg(xr + r); {acc1} }}
    {_block_reduce(op, "the row's statistics")}
    {op.final}
    for (int j = threadIdx.x; j < R; j += BLOCK) {{ float x = __ldg(xr + j); yr[j] = {op.out}; }}
}}
"""


def _fits(R: int, block: int, v: int, s: int, minb: int, sms: int = SMS) -> bool:
    """Whether a row of ``R`` splits into chunks that are all resident at once (see the module doc)."""
    n4 = -(-R // 4)
    k = -(-n4 // (block * (v + s)))
    return (
        k <= minb * sms
        and minb * block <= 2048
        and minb * (block * s * 16 + 2048) <= 227 * 1024
        and minb * block * (4 * v + 24) <= 65536
    )


#: Python of ``forward``'s helpers: the resident bound, checked with the device's SM count.
_PY = """

def _onchip_k(R, vec4, p):
    \"\"\"The chunks per row of onchip_split, or 0 where they would not all be resident at once.\"\"\"
    n4 = R // 4 if vec4 else _cdiv(R, 4)
    k = _cdiv(n4, p['BLOCK'] * (p['V'] + p['S']))
    return k


def _onchip_sms(x):
    if x.is_cuda:
        return torch.cuda.get_device_properties(x.device).multi_processor_count
    return _ONCHIP_SMS


def _onchip_ok(outer, R, k, sms, p):
    return (
        0 < k <= p['MINB'] * sms
        and p['MINB'] * p['BLOCK'] <= 2048
        and p['MINB'] * (p['BLOCK'] * p['S'] * 16 + 2048) <= 227 * 1024
        and p['MINB'] * p['BLOCK'] * (4 * p['V'] + 24) <= 65536
        and outer * k < 2**31 - 1
    )
"""


def onchip_split(spec: OpSpec) -> Recipe | None:
    """The ``onchip_split`` recipe for ``spec``, or None where it does not apply (see the module doc)."""
    if spec.family not in FAMILIES or spec.inner != 1 or spec.outer < 1:
        return None
    R = spec.R
    if R < 4 * MIN_ROW4 or R >= 2**31 - 4 or spec.outer * R >= 2**62:
        return None
    defaults: dict[str, ParamValue]
    if spec.family == "layer_norm":  # 16 MB rows: more of each row on chip (registers and shared memory)
        defaults = {"BLOCK": 512, "V": 4, "S": 12, "MINB": 2, "HINT": 1}
    else:
        defaults = {"BLOCK": 128, "V": 8, "S": 0, "MINB": 8, "HINT": 1}
    if not _fits(R, *(int(defaults[k]) for k in ("BLOCK", "V", "S", "MINB"))):
        return None
    op = row_op(spec, "cuda")
    if op.reduce:
        return None
    ns = len(op.stats)
    wbp = "self.m0.weight, self.m0.bias, " if spec.affine else ""
    aligned = "_aligned(x, y, self.m0.weight, self.m0.bias)" if spec.affine else "_aligned(x, y)"
    if spec.family == "layer_norm":
        sizes = f"outer, R = _prod(x.shape[:{spec.dim}]), _prod(x.shape[{spec.dim}:])"
    else:
        sizes = f"outer, R = _prod(x.shape[:{spec.dim}]), x.shape[{spec.dim}]"
    forward = f"""
x = x.contiguous()
{sizes}
y = torch.empty_like(x)
vec4 = int(R % 4 == 0 and {aligned})
k = _onchip_k(R, vec4, p)
if _onchip_ok(outer, R, k, _onchip_sms(x), p):
    sync = torch.zeros(1 + outer, dtype=torch.int32, device=x.device)
    part = torch.empty(outer * k * {ns}, dtype=torch.float32, device=x.device)
    # dynamic shared memory just under 48 KB plus the static arrays passes 48 KB: ask above it, so the
    # launcher raises the function's limit (it compares the dynamic size alone with 48 KB)
    shm = p['BLOCK'] * p['S'] * 16
    shm = 48 * 1024 + 16 if 40 * 1024 < shm <= 48 * 1024 else shm
    self._program().rows(x, {wbp}y, part, sync, outer, R, k, vec4, grid=(outer * k, 1, 1), block=(p['BLOCK'], 1, 1), shared_mem=shm)
else:
    self._program().rows_plain(x, {wbp}y, outer, R, grid=(outer, 1, 1), block=(p['BLOCK'], 1, 1))
return y
"""
    n4 = R // 4
    return Recipe(
        f"{spec.family}/onchip_split",
        spec.family,
        "cuda",
        kernel_source(spec),
        forward,
        ["x"],
        TunableSpace(
            params={
                "BLOCK": [128, 256, 512],
                "V": [4, 8, 12, 16],
                "S": [0, 4, 8, 12, 16],
                "MINB": [1, 2, 3, 4, 6, 8],
                "HINT": [0, 1],
            },
            restrictions=[
                "MINB * BLOCK <= 2048",
                "MINB * (BLOCK * S * 16 + 2048) <= 227 * 1024",
                f"({n4} + BLOCK * (V + S) - 1) // (BLOCK * (V + S)) <= MINB * {SMS}",
                "MINB * BLOCK * (4 * V + 24) <= 65536",
            ],
        ),
        defaults,
        # below cluster_stream and split_rows_vec: slower than both on the H200 (see the module doc)
        rank=2,
        modules=spec.modules,
        preamble=_PY + f"\n#: SMs assumed off the GPU (the CPU emulation)\n_ONCHIP_SMS = {SMS}\n",
        description="rows cut into chunks held on chip (registers and shared memory), a block each, taken "
        "by ticket; the row's partial statistics meet through a global workspace and an arrival counter: "
        "one read and one write [index64: 64-bit row offsets, 32-bit positions within a row]",
    )


def recipes(spec: OpSpec, language: str) -> list[Recipe]:
    """This module's recipes for ``spec`` in ``language`` (CUDA only)."""
    if language != "cuda":
        return []
    out = [onchip_split(spec)]
    return [r for r in out if r is not None]
