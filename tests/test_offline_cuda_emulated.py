"""The offline generator's CUDA speed variants, run as CUDA source on the CPU (slow; needs g++ with C++20).

:data:`EMU_H` maps the CUDA subset the kernels use onto C++20 threads: a block's threads are
``std::thread`` s, ``__syncthreads`` a ``std::barrier``, warp shuffles an exchange through a per-warp
barrier, ``__shared__`` a static (blocks run one after another). :func:`emu_load` stands in for
``kfoundry.runtime.load``: it compiles the kernel source with that header into a shared library and
launches kernels through ctypes on CPU tensors, so a rendered ``ModelNew`` runs unchanged and is
compared with the eager reference. Cluster kernels (distributed shared memory) run
where they choose clusters of one block.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import lower as lowering
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

EMU_H = r"""// CPU emulation of the CUDA subset our kernels use: a block's threads are std::threads, __syncthreads a
// std::barrier, warp shuffles a per-warp exchange through two barriers. Blocks run one after another.
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <algorithm>
using std::min; using std::max;
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static std::barrier<>* g_bar = nullptr;
static std::vector<std::barrier<>*> g_wbar;
static float g_xf[1024]; static long long g_xl[1024];
alignas(16) static unsigned char g_dyn[256 * 1024];
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n)
#define __shared__ static
#define __syncthreads() g_bar->arrive_and_wait()
static inline int emu_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __ldcs(const T* p) { return *p; }
template <class T> static inline void __stcs(T* p, T v) { *p = v; }
#define __expf(x) expf(x)
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float emu_xchg_f(float v, int src_lane) {
    int t = emu_tid(), w = t >> 5;
    g_wbar[w]->arrive_and_wait(); g_xf[t] = v; g_wbar[w]->arrive_and_wait();
    return g_xf[(w << 5) + (src_lane & 31)];
}
static inline long long emu_xchg_l(long long v, int src_lane) {
    int t = emu_tid(), w = t >> 5;
    g_wbar[w]->arrive_and_wait(); g_xl[t] = v; g_wbar[w]->arrive_and_wait();
    return g_xl[(w << 5) + (src_lane & 31)];
}
static inline float __shfl_xor_sync(unsigned, float v, int o) { return emu_xchg_f(v, (emu_tid() & 31) ^ o); }
static inline long long __shfl_xor_sync(unsigned, long long v, int o) { return emu_xchg_l(v, (emu_tid() & 31) ^ o); }
static inline float __shfl_up_sync(unsigned, float v, int o) { int l = emu_tid() & 31; float r = emu_xchg_f(v, l >= o ? l - o : l); return r; }
static inline float __shfl_sync(unsigned, float v, int s) { return emu_xchg_f(v, s); }
#define __int_as_float(i) (INFINITY)
// clusters of one block only (the tests pick shapes where the recipes choose CL 1): rank 0, the cluster's
// shared memory the block's own, the cluster barrier the block's
#define __cluster_dims__(...)
static inline unsigned __clusterRelativeBlockRank() { return 0; }
template <class T> static inline T* __cluster_map_shared_rank(T* p, unsigned) { return p; }
#define __cluster_barrier_arrive() g_bar->arrive_and_wait()
#define __cluster_barrier_wait() ((void)0)
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
// bulk copies on mbarriers (cookbook_rows_bulk): the copy lands at once; a barrier counts its phases
#define KF_BULK_HELPERS
static inline void kf_bar_init(unsigned long long* b) { __atomic_store_n(b, 0ull, __ATOMIC_SEQ_CST); }
static inline void kf_bar_init_fence() {}
static inline void kf_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
    std::memcpy(dst, src, bytes); __atomic_fetch_add(b, 1ull, __ATOMIC_SEQ_CST); }
static inline void kf_bar_wait(unsigned long long* b, unsigned parity) {
    while ((__atomic_load_n(b, __ATOMIC_SEQ_CST) & 1ull) == parity) std::this_thread::yield(); }
static void emu_launch(dim3 g, dim3 b, const std::function<void()>& fn) {
    gridDim = g; blockDim = b;
    unsigned n = b.x * b.y * b.z;
    for (unsigned z = 0; z < g.z; ++z) for (unsigned y = 0; y < g.y; ++y) for (unsigned x = 0; x < g.x; ++x) {
        std::barrier<> bar(n); g_bar = &bar;
        std::vector<std::barrier<>*> wb; for (unsigned w = 0; w < (n + 31) / 32; ++w) wb.push_back(new std::barrier<>(std::min(32u, n - 32 * w)));
        g_wbar = wb;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < n; ++t) ts.emplace_back([=, &fn] {
            threadIdx = {t % b.x, (t / b.x) % b.y, t / (b.x * b.y)}; blockIdx = {x, y, z}; fn(); });
        for (auto& t : ts) t.join();
        for (auto* p : wb) delete p;
    }
}
"""

_SIG = re.compile(
    r'(?:KF_KERNEL|extern "C" __global__ void)(?:\s+__cluster_dims__\([^)]*\))?'
    r"(?:\s+__launch_bounds__\([^)]*\))?(?:\s+KF_\w*BOUNDS)?\s+(\w+)\s*\(([^)]*)\)",
    re.S,
)
_CTYPES = {"ptr": ctypes.c_void_p, "ll": ctypes.c_longlong, "f": ctypes.c_float, "i": ctypes.c_int}
_CDECL = {"ptr": "void*", "ll": "long long", "f": "float", "i": "int"}


def _kind(param: str) -> str:
    p = param.strip()
    return "ptr" if "*" in p else "ll" if p.startswith("long long") else "f" if p.startswith("float") else "i"


class _Module:
    def __init__(self, lib: ctypes.CDLL, kernels: dict[str, list[str]]) -> None:
        self.lib, self.kernels = lib, kernels

    def __getattr__(self, name: str) -> Callable[..., None]:
        kinds = self.kernels[name]
        fn = getattr(self.lib, "launch_" + name)
        fn.argtypes = [ctypes.c_uint] * 6 + [_CTYPES[k] for k in kinds]

        def call(
            *args: Any, grid: tuple[int, ...] = (1,), block: tuple[int, ...] = (1,), shared_mem: int = 0
        ) -> None:
            g = tuple(grid) + (1,) * (3 - len(grid))
            b = tuple(block) + (1,) * (3 - len(block))
            assert len(args) == len(kinds), (name, len(args), len(kinds))
            conv = [
                a.data_ptr() if isinstance(a, torch.Tensor) else float(a) if k == "f" else int(a)
                for a, k in zip(args, kinds, strict=True)
            ]
            fn(*[int(v) for v in g], *[int(v) for v in b], *conv)

        return call


def emu_load(
    source: str, defines: dict[str, Any] | None = None, build_options: list[str] | None = None
) -> _Module:
    """Compile a CUDA program for the CPU emulation (a cached shared library per source and defines)."""
    defs = "".join(
        f"#define {k} {int(v) if isinstance(v, bool) else v}\n" for k, v in (defines or {}).items()
    )
    kernels: dict[str, list[str]] = {}
    wrappers = []
    for m in _SIG.finditer(source):
        name, params = m.group(1), [p for p in m.group(2).split(",") if p.strip()]
        kinds = [_kind(p) for p in params]
        kernels[name] = kinds
        decl = "".join(f", {_CDECL[k]} a{i}" for i, k in enumerate(kinds))
        cast = ", ".join(
            f"({p.strip().rsplit(' ', 1)[0]})a{i}" if k == "ptr" else f"a{i}"
            for i, (p, k) in enumerate(zip(params, kinds, strict=True))
        )
        wrappers.append(
            f'extern "C" void launch_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, '
            f"unsigned bz{decl}) {{ emu_launch({{gx, gy, gz}}, {{bx, by, bz}}, [=]() {{ {name}({cast}); }}); }}"
        )
    # dynamic shared memory: the emulation's one buffer (blocks run one after another)
    source = re.sub(
        r"extern __shared__ (?:__align__\(\d+\) )?(\w+) (\w+)\[\];",
        r"\1* \2 = reinterpret_cast<\1*>(g_dyn);",
        source,
    )
    full = EMU_H + defs + source + "\n" + "\n".join(wrappers) + "\n"
    cache = Path(tempfile.gettempdir()) / "kfoundry_cuda_emu"
    cache.mkdir(exist_ok=True)
    key = hashlib.sha1(full.encode()).hexdigest()[:16]
    so = cache / f"{key}.so"
    if not so.exists():
        cpp = cache / f"{key}.cpp"
        cpp.write_text(full)
        cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-o", str(so), str(cpp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return _Module(ctypes.CDLL(str(so)), kernels)


#: (problem, shape override, recipe, parameters): the new CUDA variants at small shapes that still take
#: their main paths (full 128 x 128 tiles, cached and streamed rows, lanes).
CASES: list[tuple[str, dict[str, int], str, dict[str, int]]] = [
    ("level1/matmul_large_k.py", {"M": 256, "N": 256, "K": 2048}, "matmul/sgemm_128x128", {}),
    ("level1/matmul_large_k.py", {"M": 256, "N": 256, "K": 2048}, "matmul/sgemm_128x128_split_k", {}),
    (
        "level2/gemm_swish_scaling.py",
        {"batch_size": 128, "in_features": 64, "out_features": 256},
        "matmul/sgemm_128x128",
        {},
    ),
    ("level1/matrix_vector.py", {"M": 37, "K": 1028}, "matmul/gemv_block", {}),
    # K split over warps: float4 batches of eight and their remainder; odd K (scalar); a last partial block
    ("level1/matrix_vector.py", {"M": 37, "K": 8196}, "matmul/gemv_rows", {}),
    ("level1/matrix_vector.py", {"M": 3, "K": 1001}, "matmul/gemv_rows", {"KS": 2}),
    ("level1/max_over_dim.py", {"batch_size": 3, "dim1": 70, "dim2": 37}, "reduce/inner_columns", {}),
    ("level1/min_over_dim.py", {"batch_size": 3, "dim1": 20, "dim2": 37}, "reduce/inner_columns", {}),
    # rows split into ranges: eight-load batches and a remainder, odd columns, keepdim
    ("level1/mean_dim1.py", {"batch_size": 2, "dim1": 203, "dim2": 37}, "reduce/inner_split", {}),
    ("level1/sum_reduction_keepdim.py", {"batch_size": 2, "dim1": 150, "dim2": 9}, "reduce/inner_split", {}),
    ("level1/max_over_dim.py", {"batch_size": 3, "dim1": 130, "dim2": 37}, "reduce/inner_split", {}),
    (
        "level1/layer_norm_4d.py",
        {"batch_size": 3, "features": 4, "dim1": 16, "dim2": 33},
        "layer_norm/split_rows_vec",
        {},
    ),
    # chunks of 256 float4: the write pass's four-load batches and its remainder
    (
        "level1/layer_norm_4d.py",
        {"batch_size": 2, "features": 4, "dim1": 64, "dim2": 37},
        "layer_norm/split_rows_vec",
        {"BLOCK": 64},
    ),
    (
        "level1/log_softmax_rows.py",
        {"batch_size": 2, "dim": 9000},
        "log_softmax/split_rows_vec",
        {"BLOCK": 64},
    ),
    ("level1/argmax_dim.py", {}, "graph/fused_coop", {}),
    ("level1/cumsum_reverse.py", {}, "graph/fused_coop", {}),
    ("level1/cumprod.py", {}, "graph/fused_coop", {}),
    # eight elements a lane per step: rows that end inside a step, and after whole steps
    ("level1/cumprod.py", {}, "graph/fused_coop", {"KF_SU": 8}),
    ("level1/cumsum_masked.py", {"batch_size": 3, "input_shape": 600}, "graph/fused_coop", {"KF_SU": 8}),
    ("level1/cumsum_masked.py", {"batch_size": 2, "input_shape": 512}, "graph/fused_coop", {"KF_SU": 8}),
    ("level1/softmax_dim1_3d.py", {}, "graph/fused_coop", {}),
    ("level1/cosine_similarity_loss.py", {}, "graph/fused_coop", {}),
    ("level2/gemm_max_subtract_gelu.py", {}, "graph/fused_coop", {"RB": 4}),
    ("level1/mingpt_gelu.py", {}, "elementwise/vector_blocked", {}),  # 4995: a guarded last block
    ("level1/swish.py", {"batch_size": 3, "dim": 4099}, "elementwise/vector_blocked", {"ILP": 8}),
    ("level1/swish.py", {"batch_size": 1, "dim": 3}, "elementwise/vector_blocked", {}),  # scalars only
    # implicit-GEMM convolution: float4 tile reads and output stores (64 positions), transposed phases
    (
        "level1/conv2d_square.py",
        {"batch_size": 2, "in_channels": 3, "out_channels": 8, "height": 10, "width": 10},
        "graph/fused_coop",
        {"CM": 1, "CN": 4},
    ),
    (
        "level1/conv_transpose2d.py",
        {"batch_size": 1, "in_channels": 4, "out_channels": 8, "height": 5, "width": 6},
        "graph/fused_coop",
        {"CM": 2, "CN": 8},
    ),
    ("level2/conv2d_mish_mish.py", {"batch_size": 2, "height": 10, "width": 10}, "graph/fused_coop", {}),
    # long norm rows: the split statistics' float4 loads
    (
        "level1/batch_norm.py",
        {"batch_size": 2, "features": 3, "dim1": 64, "dim2": 68},
        "graph/fused_coop",
        {},
    ),
]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("key", "shape", "name", "params"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_cuda_variant_matches_eager_on_the_cpu_emulation(
    key: str, shape: dict[str, int], name: str, params: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "load", emu_load)
    monkeypatch.setattr(lowering, "LANE_MIN", 4)
    small = json.loads((DATA / "small_shapes.json").read_text())
    problem = load_problem(DATA / key, shape or small[key])
    recipe = next(r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == name)
    torch.manual_seed(0)
    reference = problem.make_reference()
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = reference(*inputs)
    namespace: dict[str, Any] = {"PARAMS": {**recipe.defaults, **params}, "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        got = model(*inputs)
    assert got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-4, atol=1e-4, equal_nan=True)


#: (problem, shape, recipe, parameters) of the persistent cluster kernel at clusters of one block: more rows
#: than the persistent grid's clusters (each takes rows from the atomic counter while it writes the last),
#: rows of fewer float4 than the block's threads, and of two batches of UNROLL loads per thread.
STREAM_CASES: list[Any] = [
    # slow (25 s): log_softmax's case below runs the same kernel in the default tier
    pytest.param(
        "level1/softmax_rows.py",
        {"batch_size": 300, "dim": 200},
        "softmax/cluster_stream",
        {"BLOCK": 64},
        marks=pytest.mark.slow,
    ),
    (
        "level1/log_softmax_rows.py",
        {"batch_size": 300, "dim": 2000},
        "log_softmax/cluster_stream",
        {"BLOCK": 64, "UNROLL": 4},
    ),
    (
        "level1/layer_norm_module.py",
        {"batch_size": 300, "features": 4, "dim1": 5, "dim2": 12},
        "layer_norm/cluster_stream",
        {"BLOCK": 64, "UNROLL": 4},
    ),
    # the copy-engine variant: segments that split the chunk unevenly, empty ones, two per thread
    (
        "level1/softmax_rows.py",
        {"batch_size": 300, "dim": 200},
        "softmax/cluster_bulk",
        {"BLOCK": 64, "NSEG": 16},
    ),
    (
        "level1/log_softmax_rows.py",
        {"batch_size": 300, "dim": 2000},
        "log_softmax/cluster_bulk",
        {"BLOCK": 64, "NSEG": 3},
    ),
    (
        "level1/layer_norm_module.py",
        {"batch_size": 300, "features": 4, "dim1": 5, "dim2": 12},
        "layer_norm/cluster_bulk",
        {"BLOCK": 32, "NSEG": 8},
    ),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(
    ("key", "shape", "name", "params"),
    STREAM_CASES,
    ids=[f"{v[0]}-{v[2]}" for v in (getattr(c, "values", c) for c in STREAM_CASES)],
)
def test_persistent_cluster_rows_match_eager_on_the_cpu_emulation(
    key: str, shape: dict[str, int], name: str, params: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "load", emu_load)
    problem = load_problem(DATA / key, shape)
    recipe = next(r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == name)
    source = recipe.render()
    assert "\n_SMS = 132\n" in source
    source = source.replace("\n_SMS = 132\n", "\n_SMS = 2\n")  # a 2-SM GPU: 300 rows over 64 clusters
    torch.manual_seed(0)
    reference = problem.make_reference()
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = reference(*inputs)
    namespace: dict[str, Any] = {"PARAMS": {**recipe.defaults, **params}, "__name__": "kf_candidate"}
    exec(compile(source, recipe.name, "exec"), namespace)
    assert namespace["_cluster"](300, inputs[0][0].numel()) == 1  # type: ignore[operator]
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        got = model(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("key", ["level1/l2_norm.py"])
def test_fused_row_reduction_clusters_loop_over_their_rows_on_the_cpu_emulation(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cooperative schedule's reduction-plus-consumer row kernel (``lower_scan.fused_rows``) on a
    persistent grid (RG waves of clusters): cut to a 2-SM GPU, 4 blocks take 75 rows each, in order."""
    monkeypatch.setattr(runtime, "load", emu_load)
    problem = load_problem(DATA / key, {"batch_size": 300, "dim": 5001})
    recipe = next(
        r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == "graph/fused_coop"
    )
    source = recipe.render()
    wave = "p['RG'] * 132 // _kf_cl"
    assert wave in source and "k0_rows" in source, "the fused row kernel or its launch changed shape"
    torch.manual_seed(0)
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = problem.make_reference()(*inputs)
    namespace: dict[str, Any] = {"PARAMS": {**recipe.defaults, "RG": 2}, "__name__": "kf_candidate"}
    exec(compile(source.replace(wave, "p['RG'] * 2 // _kf_cl"), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        got = model(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
