"""Measured behaviour descriptors: real compiles (NVRTC, hipcc, clang), cells along the right axes.

Compile-only: no GPU is needed. Each family skips with the reason when its compiler is missing.
"""

from __future__ import annotations

import functools

import pytest

from kfoundry.core.behaviour.amdgpu import find_objdump
from kfoundry.core.behaviour.llvm_ir import find_clang
from kfoundry.core.behaviour.registry import extractor_for
from kfoundry.core.behaviour.space import DescriptorSpace, build_space, declared_defaults
from kfoundry.core.models import Candidate
from kfoundry.plugins.backends.cuda_compile import nvrtc_available

needs_nvrtc = pytest.mark.skipif(not nvrtc_available()[0], reason=nvrtc_available()[1])

# -- CUDA kernels --------------------------------------------------------------------------------

SUM_A = """
#define STEPS 4
extern "C" __global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int k = 0; k < STEPS; ++k) v = v * 1.5f + 0.25f;
    y[i] = v;
}
"""
# the same kernel: another macro spelling, comments naming techniques it does not use
SUM_B = """
// uses __shared__ tiles, __shfl_xor_sync and double precision (it does not)
#define TWO 2
#define N_STEPS (TWO * TWO)
#define MULADD(a, b, c) fmaf(a, b, c)
extern "C" __global__ void scale(const float* x, float* y, int n) {
    /* __syncthreads(); cp.async */
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    for (int step = 0; step < N_STEPS; step++) { v = MULADD(v, 1.5f, 0.25f); }
    y[i] = v;
}
"""
SUM_FP64 = SUM_A.replace("float", "double").replace("1.5f", "1.5").replace("0.25f", "0.25")

MM_NAIVE = """
extern "C" __global__ void mm(const float* A, const float* B, float* C, int N) {
    int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N || c >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < N; ++k) acc += A[r * N + k] * B[k * N + c];
    C[r * N + c] = acc;
}
"""
MM_TILED = """
#define TS 16
extern "C" __global__ void mm(const float* A, const float* B, float* C, int N) {
    __shared__ float As[TS][TS];
    __shared__ float Bs[TS][TS];
    int tr = threadIdx.y, tc = threadIdx.x;
    int r = blockIdx.y * TS + tr, c = blockIdx.x * TS + tc;
    float acc = 0.0f;
    for (int t = 0; t < N; t += TS) {
        As[tr][tc] = A[r * N + t + tc];
        Bs[tr][tc] = B[(t + tr) * N + c];
        __syncthreads();
        for (int k = 0; k < TS; ++k) acc += As[tr][k] * Bs[k][tc];
        __syncthreads();
    }
    C[r * N + c] = acc;
}
"""
RED_PLAIN = """
extern "C" __global__ void rowsum(const float* x, float* y, int n) {
    int row = blockIdx.x;
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += x[row * n + i];
    y[row] = s;
}
"""
RED_SHUFFLE = """
extern "C" __global__ void rowsum(const float* x, float* y, int n) {
    int row = blockIdx.x, lane = threadIdx.x;
    float s = 0.0f;
    for (int i = lane; i < n; i += 32) s += x[row * n + i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[row] = s;
}
"""


def _cand(source: str, language: str) -> Candidate:
    return Candidate(source=source, language=language, kind="native")


@functools.cache
def _space(language: str) -> DescriptorSpace:
    """One space per language for the module: a kernel measured once is not compiled again."""
    return build_space(language, "measured", extractor=extractor_for(language))


def _axes(space: DescriptorSpace, source: str, language: str) -> dict[str, int]:
    return dict(zip(space.names, space.cell(_cand(source, language)), strict=True))


@needs_nvrtc
def test_cuda_comments_and_macro_spelling_do_not_move_a_kernel() -> None:
    space = _space("cuda")
    a, b = space.features(_cand(SUM_A, "cuda")), space.features(_cand(SUM_B, "cuda"))
    assert a["measured"] == 1.0
    assert space.cell(_cand(SUM_A, "cuda")) == space.cell(_cand(SUM_B, "cuda"))
    assert {k: a[k] for k in ("intensity", "hierarchy", "mix", "registers")} == {
        k: b[k] for k in ("intensity", "hierarchy", "mix", "registers")
    }
    # the static patterns are fooled by the same comments and macros
    static = build_space("cuda", "static", extractor=extractor_for("cuda"))
    assert static.cell(_cand(SUM_A, "cuda")) != static.cell(_cand(SUM_B, "cuda"))


@needs_nvrtc
def test_cuda_shared_memory_tiling_moves_hierarchy_and_intensity() -> None:
    space = _space("cuda")
    naive, tiled = _axes(space, MM_NAIVE, "cuda"), _axes(space, MM_TILED, "cuda")
    assert naive["hierarchy"] < 2 <= tiled["hierarchy"]
    assert tiled["intensity"] > naive["intensity"]
    assert naive["mix"] == tiled["mix"] == 1
    feats = space.features(_cand(MM_TILED, "cuda"))
    assert feats["shared_bytes"] == 2 * 16 * 16 * 4 and feats["barriers"] > 0


@needs_nvrtc
def test_cuda_warp_shuffles_move_hierarchy_only() -> None:
    space = _space("cuda")
    plain, shuffled = _axes(space, RED_PLAIN, "cuda"), _axes(space, RED_SHUFFLE, "cuda")
    assert plain["hierarchy"] < 2 and shuffled["hierarchy"] == 2
    assert plain["mix"] == shuffled["mix"]
    assert space.features(_cand(RED_SHUFFLE, "cuda"))["shuffles"] > 0


@needs_nvrtc
def test_cuda_fp64_moves_the_instruction_mix() -> None:
    space = _space("cuda")
    f32, f64 = _axes(space, SUM_A, "cuda"), _axes(space, SUM_FP64, "cuda")
    assert f32["mix"] == 1 and f64["mix"] == 3
    assert f32["hierarchy"] == f64["hierarchy"]
    assert space.features(_cand(SUM_FP64, "cuda"))["fp64_share"] > 0.9


@needs_nvrtc
def test_cuda_occupancy_from_registers_shared_memory_and_launch_bounds() -> None:
    from kfoundry.core.behaviour.cuda import SmLimits, occupancy

    h200 = SmLimits()
    assert occupancy(32, 0, 256, h200) == 1.0
    assert occupancy(128, 0, 256, h200) == 0.25  # 65536 / (128 * 32) = 16 warps of 64
    assert occupancy(32, 100 * 1024, 256, h200) == 0.25  # two 100 KiB blocks fit in 228 KiB
    big = SUM_A.replace('extern "C" __global__ void', 'extern "C" __global__ void __launch_bounds__(1024)')
    space = _space("cuda")
    assert space.features(_cand(big, "cuda"))["occupancy"] == 1.0


@needs_nvrtc
def test_cuda_kernelbench_candidate_with_shape_macros_and_params() -> None:
    """Kernels inside a ModelNew are measured with PARAMS as defines; run-time shape macros get a placeholder."""
    kernel = MM_TILED.replace("#define TS 16\n", "").replace("int N)", "int unused)")
    source = f'SRC = r"""{kernel}"""\nclass ModelNew:\n    def forward(self, a):\n        block=(PARAMS["TS"], 1)\n'
    cand = Candidate(source=source, language="cuda", params={"TS": 16})
    feats = _space("cuda").features(cand)
    assert feats["measured"] == 1.0 and feats["shared_bytes"] == 2048


def test_static_stand_in_when_a_language_has_no_measurer(caplog) -> None:
    """An extractor with static patterns only (a plugin language's, say): one warning, never a silent zero cell."""
    from kfoundry.core.descriptors_sycl import sycl_descriptors

    space = build_space("sycl", "measured", extractor=sycl_descriptors(measurer=None))
    src = "void k(sycl::nd_item<1> it) { sycl::group_barrier(it.get_group()); }"
    with caplog.at_level("WARNING", logger="kfoundry.descriptors"):
        cell = space.cell(_cand(src, "sycl"))
        space.cell(_cand(src + " ", "sycl"))
    assert len(cell) == 4
    lines = [r.getMessage() for r in caplog.records if "sycl" in r.getMessage()]
    assert len(lines) <= 1  # once per process (another test may have said it already)
    assert space.features(_cand(src, "sycl"))["measured"] == 0.0


# -- HIP -----------------------------------------------------------------------------------------


def _hip_ok() -> tuple[bool, str]:
    import shutil

    if shutil.which("hipcc") is None:
        return False, "hipcc is not installed (apt-get install hipcc)"
    if find_objdump() is None:
        return False, "no llvm-objdump to disassemble AMDGPU code objects"
    return True, ""


needs_hip = pytest.mark.skipif(not _hip_ok()[0], reason=_hip_ok()[1])


def _hip(src: str) -> str:
    return src.replace("__shfl_xor_sync(0xffffffffu, s, o)", "__shfl_xor(s, o)").replace("+= 32", "+= 64")


@pytest.mark.slow
@needs_hip
def test_hip_cells_along_the_right_axes() -> None:
    space = _space("hip")
    assert space.cell(_cand(_hip(SUM_A), "hip")) == space.cell(_cand(_hip(SUM_B), "hip"))
    naive, tiled = _axes(space, _hip(MM_NAIVE), "hip"), _axes(space, _hip(MM_TILED), "hip")
    assert naive["hierarchy"] < 2 <= tiled["hierarchy"] and tiled["intensity"] > naive["intensity"]
    plain, shuffled = _axes(space, _hip(RED_PLAIN), "hip"), _axes(space, _hip(RED_SHUFFLE), "hip")
    assert plain["hierarchy"] < 2 <= shuffled["hierarchy"] and plain["mix"] == shuffled["mix"]
    f32, f64 = _axes(space, _hip(SUM_A), "hip"), _axes(space, _hip(SUM_FP64), "hip")
    assert f32["mix"] == 1 and f64["mix"] == 3
    feats = space.features(_cand(_hip(MM_TILED), "hip"))
    assert feats["shared_bytes"] == 2048 and 0 < feats["occupancy"] <= 1


# -- OpenCL --------------------------------------------------------------------------------------

CL_NAIVE = """
__kernel void mm(__global const float* A, __global const float* B, __global float* C, int N) {
    int r = get_global_id(1), c = get_global_id(0);
    float acc = 0.0f;
    for (int k = 0; k < N; ++k) acc += A[r * N + k] * B[k * N + c];
    C[r * N + c] = acc;
}
"""
CL_TILED = """
__kernel void mm(__global const float* A, __global const float* B, __global float* C, int N) {
    __local float As[TS][TS];
    __local float Bs[TS][TS];
    int tr = get_local_id(1), tc = get_local_id(0);
    int r = get_global_id(1), c = get_global_id(0);
    float acc = 0.0f;
    for (int t = 0; t < N; t += TS) {
        As[tr][tc] = A[r * N + t + tc];
        Bs[tr][tc] = B[(t + tr) * N + c];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; ++k) acc = fma(As[tr][k], Bs[k][tc], acc);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    C[r * N + c] = acc;
}
"""
CL_TILED_COMMENTED = "// a naive kernel, says this comment\n#define TILE_SIDE TS\n" + CL_TILED.replace(
    "for (int t = 0; t < N; t += TS)", "for (int t = 0; t < N; t += TILE_SIDE) /* vload4 */"
)

needs_clang = pytest.mark.skipif(find_clang() is None, reason="no LLVM clang to compile OpenCL C to IR")


@needs_clang
def test_opencl_measured_from_llvm_ir() -> None:
    space = _space("opencl")
    naive = Candidate(source=CL_NAIVE, language="opencl", kind="native")
    tiled = Candidate(source=CL_TILED, language="opencl", kind="native", params={"TS": 16})
    commented = Candidate(source=CL_TILED_COMMENTED, language="opencl", kind="native", params={"TS": 16})
    n, t = (
        dict(zip(space.names, space.cell(naive), strict=True)),
        dict(zip(space.names, space.cell(tiled), strict=True)),
    )
    assert n["hierarchy"] < 2 <= t["hierarchy"] and t["intensity"] > n["intensity"]
    assert space.cell(commented) == space.cell(tiled)
    assert space.features(tiled)["shared_bytes"] == 2048
    # a shape macro the candidate passes at run time gets a placeholder, so the kernel is still measured
    shaped = Candidate(
        source=CL_TILED.replace("int N)", "int unused)"), language="opencl", kind="native", params={"TS": 16}
    )
    assert space.features(shaped)["measured"] == 1.0


@needs_nvrtc
def test_generation_requests_carry_the_run_space() -> None:
    """A generator places kernels in the run's own space (``extra["descriptors"]``), static by default."""
    from types import SimpleNamespace

    from kfoundry.core.behaviour.run import extractor_for_request
    from kfoundry.core.descriptors import PatternDescriptors

    space = _space("cuda")
    measured = SimpleNamespace(language="cuda", device=None, extra={"descriptors": space.describe()})
    extractor = extractor_for_request(measured)
    assert extractor.axes == space.names
    assert extractor.cell(MM_TILED) == space.cell(_cand(MM_TILED, "cuda"))
    static = SimpleNamespace(language="cuda", device=None, extra={})
    assert isinstance(extractor_for_request(static), PatternDescriptors)


@needs_nvrtc
def test_ptx_and_sass_listings_agree_on_the_axes() -> None:
    """Without nvdisasm the PTX NVRTC emitted is read instead; the axes come out the same."""
    from kfoundry.core.behaviour.cuda import instruction_mix
    from kfoundry.core.behaviour.features import derive
    from kfoundry.plugins.backends.cuda_compile import compile_cuda

    for src in (MM_TILED, SUM_FP64, RED_SHUFFLE):
        result = compile_cuda(src, arch="sm_90")
        ptx_mix, name = instruction_mix(b"", result.ptx)
        assert name == "ptx" and ptx_mix.total > 0
        sass_mix, _ = instruction_mix(result.cubin, result.ptx)
        shared = float(max(r.get("shared_bytes", 0) for r in result.resources.values()))
        a, b = derive(ptx_mix, shared_bytes=shared), derive(sass_mix, shared_bytes=shared)
        assert (a["hierarchy"], a["mix"]) == (b["hierarchy"], b["mix"])


def test_loop_depth_follows_the_control_flow_not_the_layout() -> None:
    """An inner loop laid out after its outer loop's latch (as LLVM does) is still two loops deep."""
    from kfoundry.core.behaviour.mix import Instr, Listing, loop_depths, weigh

    code = Listing()
    code.add(Instr("int"))  # 0: entry
    code.label("outer")
    code.add(Instr("global_load", global_bytes=4))  # 1: outer header
    code.branch("inner")
    code.add(Instr("other"), stop=True)  # 2: jump to the inner loop
    code.label("latch")
    code.branch("outer")
    code.add(Instr("other"))  # 3: outer latch, back to the header
    code.add(Instr("other"), stop=True)  # 4: return
    code.label("inner")
    code.add(Instr("fp32", 2))  # 5: inner body
    code.branch("inner")
    code.add(Instr("other"))  # 6: inner latch
    code.branch("latch")
    code.add(Instr("other"), stop=True)  # 7: back to the outer latch
    assert loop_depths(code) == [0, 1, 1, 1, 0, 2, 2, 1]
    assert weigh([code]).flops == 2 * 64


def test_bare_recipe_source_reads_its_declared_defaults() -> None:
    line = "# PARAMS (template parameter values) is injected by the kfoundry harness; defaults: {'BM': 64, 'TM': 4}"
    assert declared_defaults(f"import torch\n{line}\nclass ModelNew: ...\n") == {"BM": 64, "TM": 4}
    assert declared_defaults("# PARAMS defaults: {'BM': __import__('os')}\n") == {}
    assert declared_defaults("x = 1\n") == {}


@needs_nvrtc
def test_generator_places_a_tiled_recipe_at_its_defaults_quickly() -> None:
    """A bare rendered recipe compiles at its declared defaults, not with 1024 for every tile size
    (the register-blocked double-buffer matmul took NVRTC 270 s that way)."""
    import time
    from pathlib import Path

    from kfoundry.core.behaviour.run import SpaceExtractor
    from kfoundry.core.problem import load_problem
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator

    root = Path(__file__).resolve().parents[1]
    problem = load_problem(root / "examples/kernelbench/matmul.py")
    extractor = SpaceExtractor(build_space("cuda", "measured", problem=problem), "cuda")
    generator = OfflineGenerator()
    recipes = {r.name: r for r in generator.recipes(problem.summary(), "cuda")}
    start = time.monotonic()
    cell = generator.cell(recipes["matmul/register_block_double_buffer"], extractor)
    assert time.monotonic() - start < 30
    assert cell[1] >= 2 and cell[2] == 1  # shared-memory tiles; fp32 work
