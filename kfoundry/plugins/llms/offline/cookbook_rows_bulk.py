"""``<family>/cluster_bulk``: the persistent cluster row recipe with its loads on the copy engine (sm_90).

``cluster_stream`` (Nsight Compute on the H200, session 13) holds one 196 KB block per SM and reads the
next row through its threads' registers: 25% occupancy, at most UNROLL float4 per thread in flight, and
nothing in flight while the block folds, waits at the cluster barrier and merges, so softmax over
4096 x 393216 ran at 58% of the DRAM peak. Here the row chunk comes in by bulk copies
(``cp.async.bulk`` from global to shared memory, completing on an mbarrier per segment): one thread
issues a segment's copy as soon as the block has written that segment of the previous row, so a whole
chunk (up to 200 KB a block) is in flight while the block still writes, and the fold of the next row
starts on the first segment that lands. ``SPLIT`` 2 doubles the cluster (up to 16 blocks, a non-portable
cluster size the launcher allows from the kernel's own cluster width) so two half chunks share each SM and
one block's barrier is covered by the other's traffic.

The statistics, the partials through distributed shared memory (double-buffered by row parity, so one
cluster barrier per row) and the row order (an atomic counter) are ``cluster_stream``'s.

Ordering: every thread reads segment s of row r before the block barrier that precedes the copy of
row r + 1 into it (a proxy fence orders the issuing thread's generic accesses before the async copy);
the copy's bytes are visible to a thread once its wait on the segment's mbarrier at that phase returns.
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.cookbook_rows import (
    _CLUSTER_PY,
    _cluster_parts,
    _cluster_size,
    _dims,
    cluster_partials,
    cluster_totals,
)
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec
from kfoundry.plugins.llms.offline.rowops import RowOp

#: mbarrier and bulk-copy helpers (PTX of sm_90); a CPU emulation defines ``KF_BULK_HELPERS`` and its own.
BULK_HELPERS = r"""
#ifndef KF_BULK_HELPERS
#define KF_BULK_HELPERS
static __device__ __forceinline__ unsigned kf_smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void kf_bar_init(unsigned long long* b) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(kf_smem(b)) : "memory");
}
static __device__ __forceinline__ void kf_bar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// one thread: the mbarrier expects `bytes`, then the copy engine brings them from global memory
static __device__ __forceinline__ void kf_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(kf_smem(b)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(kf_smem(dst)), "l"(src), "r"(bytes), "r"(kf_smem(b)) : "memory");
}
// every thread: until the phase of parity `parity` has completed (the copy issued in it has landed)
static __device__ __forceinline__ void kf_bar_wait(unsigned long long* b, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(kf_smem(b)), "r"(parity) : "memory");
    } while (!done);
}
#endif
"""


def cluster_bulk(spec: OpSpec, op: RowOp, sig: str, warp: str) -> Recipe:
    """The recipe (CUDA, rows along the last dims, one output per input element)."""
    parts = _cluster_parts(op, "[2]", "[buf]")
    shared, out4 = parts[1], parts[6]
    csig = sig.replace("int inner", "int inner, int* __restrict__ counter")
    kernel = f"""{warp.replace("void rows(", "void rows_warp(")}
{BULK_HELPERS}
// ROW_LEN (the row length), CL (blocks per row), BLOCK and NSEG (copies per chunk) are defined when built
#define NWARPS (BLOCK / 32)
#define CHUNK (ROW_LEN / CL)
#define NV4 (CHUNK / 4)
#define SEG4 ((NV4 + NSEG - 1) / NSEG)
#define SPT ((SEG4 + BLOCK - 1) / BLOCK)
#define SEG_N(s) (NV4 - (s) * SEG4 < SEG4 ? NV4 - (s) * SEG4 : SEG4)
extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(BLOCK) rows({csig}) {{
    extern __shared__ float4 kf_chunk[];
    {shared}
    __shared__ int sh_next[2];
    __shared__ unsigned long long kf_bar[NSEG];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned rank = __clusterRelativeBlockRank();
    int row = blockIdx.y;  // the same for every block of the cluster
    if (row >= outer) return;
    if (threadIdx.x == 0) {{
        #pragma unroll 1
        for (int s = 0; s < NSEG; ++s) kf_bar_init(&kf_bar[s]);
        kf_bar_init_fence();
        const float4* src = reinterpret_cast<const float4*>(X + (size_t)row * ROW_LEN + (size_t)rank * CHUNK);
        #pragma unroll 1
        for (int s = 0; s < NSEG; ++s)
            if (SEG_N(s) > 0) kf_bulk_load(kf_chunk + s * SEG4, src + s * SEG4, (unsigned)SEG_N(s) * 16u, &kf_bar[s]);
    }}
    __syncthreads();  // the mbarriers are initialised before any thread waits on them
    unsigned phase = 0;
    for (int buf = 0;; buf ^= 1) {{
        {{
            {op.declare()}
            // fold the row's chunk in, segment by segment as its copies land
            #pragma unroll 1
            for (int s = 0; s < NSEG; ++s) {{
                if (SEG_N(s) <= 0) continue;
                kf_bar_wait(&kf_bar[s], phase);
                #pragma unroll
                for (int k = 0; k < SPT; ++k) {{
                    const int c = threadIdx.x + k * BLOCK;
                    if (c < SEG_N(s)) {{ const float4 q = kf_chunk[s * SEG4 + c]; {op.acc4} }}
                }}
            }}
            {cluster_partials(op, parts)}
        }}
        phase ^= 1u;
        {cluster_totals(op, parts)}
        float4* yr4 = reinterpret_cast<float4*>(Y + (size_t)row * ROW_LEN + (size_t)rank * CHUNK);
        const float4* xn4 = reinterpret_cast<const float4*>(X + (size_t)(more ? next : row) * ROW_LEN + (size_t)rank * CHUNK);
        // write the row segment by segment; once every thread has written a segment it takes the next row's
        #pragma unroll 1
        for (int s = 0; s < NSEG; ++s) {{
            if (SEG_N(s) <= 0) continue;
            #pragma unroll
            for (int k = 0; k < SPT; ++k) {{
                const int c = threadIdx.x + k * BLOCK;
                if (c < SEG_N(s)) {{
                    float4 q = kf_chunk[s * SEG4 + c];
                    const int j0 = (int)(rank * CHUNK) + (s * SEG4 + c) * 4;
                    {{ {out4} }}
                    yr4[s * SEG4 + c] = q;
                }}
            }}
            if (more) {{
                __syncthreads();  // every thread's reads of segment s are done
                if (threadIdx.x == 0) kf_bulk_load(kf_chunk + s * SEG4, xn4 + s * SEG4, (unsigned)SEG_N(s) * 16u, &kf_bar[s]);
            }}
        }}
        if (!more) break;
        row = next;
    }}
    __cluster_barrier_arrive();  // no block leaves while another may still read its shared memory
    __cluster_barrier_wait();
}}
"""
    wb = "self.m0.weight, self.m0.bias, " if spec.affine else ""
    forward = f"""
{_dims(spec)}
cl = _cluster(outer, R)
if cl and p['SPLIT'] == 2 and R % (8 * cl) == 0:
    cl *= 2  # two half chunks per SM (a cluster of up to 16 blocks)
if cl and _aligned(x, y):
    counter = torch.zeros(1, dtype=torch.int32, device=x.device)
    chunk = R // cl * 4
    prog = self._program(ROW_LEN=R, CL=cl, NSEG=max(1, min(p['NSEG'], chunk // 16)))
    per_sm = max(1, min(2048 // p['BLOCK'], 227 * 1024 // (chunk + 1024)))  # resident blocks per SM
    prog.rows(x, {wb}y, outer, R, inner, counter, grid=(cl, max(1, min(outer, 65535, _SMS * per_sm // cl)), 1), block=(p['BLOCK'], 1, 1), shared_mem=chunk)
else:
    self._program(ROW_LEN=4, CL=1, NSEG=1).rows_warp(x, {wb}y, outer, R, inner, int(R % 4 == 0 and _aligned(x)), grid=(_cdiv(outer * 32, 128), 1, 1), block=(128, 1, 1))
return y
"""
    cl = _cluster_size(spec)
    # above cluster_stream for softmax, below it for the rest: on an H100 (session 14, calls 1 and 2, 4096 x
    # 393216) softmax 4.55-4.65 ms against cluster_stream's 5.31-5.49, log-softmax 4.63-4.80 against 4.50-4.73
    # (its output needs no exponential: the threads' own loads keep up); layer and RMS norm not timed
    top = 6 if spec.family == "softmax" else 4
    rank = (top if spec.R * 4 > 64 * 1024 else 2) if cl else 1
    return Recipe(
        f"{spec.family}/cluster_bulk",
        spec.family,
        "cuda",
        kernel,
        forward,
        ["x"],
        TunableSpace(params={"BLOCK": [256, 512, 1024], "NSEG": [2, 3, 4, 6, 8, 12], "SPLIT": [1, 2]}),
        # measured on an H100 (session 14, 4096 x 393216, 2.83 TB/s copy): NSEG 4 softmax 4.56 ms (8: 5.08,
        # 12: 4.91, 16: 5.47; cluster_stream 5.33), log-softmax 4.63 (8: 4.96; cluster_stream 4.53); BLOCK 512
        # or 256 and SPLIT 2 slower at every NSEG (two 1024-thread blocks do not fit an SM's registers)
        {"BLOCK": 1024, "NSEG": 4, "SPLIT": 1},
        rank=rank,
        modules=spec.modules,
        lazy=True,
        preamble=_CLUSTER_PY
        + "\n#: the GPU's SMs (the H200's): the persistent grid holds the clusters that are resident at once\n_SMS = 132\n",
        description="persistent clusters, a row in shared memory brought by the copy engine (bulk copies on "
        "mbarriers), the next row's copies issued as this row is written: one read and one write",
    )
