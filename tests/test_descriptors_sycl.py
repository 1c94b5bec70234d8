"""Measured SYCL descriptors: the runtime's kernel compiler builds each kernel for the Intel OpenCL CPU
device; the cell comes from the device image's SPIR-V and the kernel's info (compile only, no launch)."""

from __future__ import annotations

import logging

import pytest

from kfoundry.core.behaviour import measure_sycl, spirv
from kfoundry.core.behaviour.registry import extractor_for
from kfoundry.core.behaviour.space import DescriptorSpace, build_space
from kfoundry.core.models import Candidate
from kfoundry.plugins.backends.sycl_runtime import runtime, unavailable_reason

WHY = unavailable_reason()
needs_sycl = pytest.mark.skipif(bool(WHY), reason=WHY or "sycl runtime present")

HEADER = r"""
#include <sycl/sycl.hpp>
namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;
"""

#: A naive matrix product: every operand read from global memory inside the k loop.
NAIVE = (
    HEADER
    + r"""
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>))
void mm(const float* a, const float* b, float* c, int n) {
    auto it = syclext::this_work_item::get_nd_item<2>();
    size_t r = it.get_global_id(0), col = it.get_global_id(1);
    float acc = 0.f;
    for (int k = 0; k < n; ++k) acc += a[r * n + k] * b[k * n + col];
    c[r * n + col] = acc;
}
"""
)

#: The same kernel with comments, the loop bound behind a macro and a variant the preprocessor drops.
NAIVE_RESPELLED = (
    HEADER
    + r"""
#define BOUND(x) (x)
// a comment naming local_accessor, sub_group and group_barrier( moves nothing
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>))
void mm(const float* a, const float* b, float* c, int n) {
    /* sycl::vec<float, 4> tiled work_group_static< ... */
    auto it = syclext::this_work_item::get_nd_item<2>();
    size_t r = it.get_global_id(0), col = it.get_global_id(1);
    float acc = 0.f;
    for (int k = 0; k < BOUND(n); ++k) { acc += a[r * n + k] * b[k * n + col]; }
#if 0
    sycl::group_barrier(it.get_group()); // a tiled variant, compiled out
    syclexp::work_group_static<float[16][16]> tile;
#endif
    c[r * n + col] = acc;
}
"""
)

#: The product tiled through work-group memory (TS x TS tiles, group barriers).
TILED = (
    HEADER
    + r"""
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>))
void mm(const float* a, const float* b, float* c, int n) {
    auto it = syclext::this_work_item::get_nd_item<2>();
    syclexp::work_group_static<float[TS][TS]> ta;
    syclexp::work_group_static<float[TS][TS]> tb;
    size_t lr = it.get_local_id(0), lc = it.get_local_id(1);
    size_t r = it.get_global_id(0), col = it.get_global_id(1);
    float acc = 0.f;
    for (int t = 0; t < n; t += TS) {
        ta[lr][lc] = a[r * n + t + lc];
        tb[lr][lc] = b[(t + lr) * n + col];
        sycl::group_barrier(it.get_group());
        for (int k = 0; k < TS; ++k) acc += ta[lr][k] * tb[k][lc];
        sycl::group_barrier(it.get_group());
    }
    c[r * n + col] = acc;
}
"""
)

#: A row sum: a strided loop, then either shuffles down the sub-group or nothing.
ROWSUM = (
    HEADER
    + r"""
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void rowsum(const REAL* x, REAL* out, int cols) {
    auto it = syclext::this_work_item::get_nd_item<1>();
    auto sg = it.get_sub_group();
    size_t row = it.get_group(0), lid = it.get_local_id(0), L = it.get_local_range(0);
    REAL acc = 0;
    for (size_t j = lid; j < (size_t)cols; j += L) acc += x[row * cols + j] * x[row * cols + j];
#if SHUFFLE
    for (int o = 8; o > 0; o /= 2) acc += sycl::shift_group_left(sg, acc, o);
#endif
    if (sg.get_local_id()[0] == 0) out[row * L + lid] = acc;
}
"""
)


def _space() -> DescriptorSpace:
    return build_space("sycl", "measured", extractor=extractor_for("sycl"))


def _feats(source: str, **params: int) -> dict[str, float]:
    return _space().features(Candidate(source=source, language="sycl", kind="native", params=params))


def _cell(source: str, **params: int) -> dict[str, int]:
    space = _space()
    cell = space.cell(Candidate(source=source, language="sycl", kind="native", params=params))
    return dict(zip(space.names, cell, strict=True))


@needs_sycl
def test_comments_and_macro_spelling_do_not_move_the_measured_cell() -> None:
    a, b = _feats(NAIVE), _feats(NAIVE_RESPELLED)
    assert a["measured"] == b["measured"] == 1.0
    assert _cell(NAIVE) == _cell(NAIVE_RESPELLED)
    assert a["spirv_instructions"] == b["spirv_instructions"]
    # the static patterns, which read the text, are moved by the compiled-out variant
    ex = extractor_for("sycl")
    assert ex.extract(NAIVE) != ex.extract(NAIVE_RESPELLED)


@needs_sycl
def test_local_memory_tiling_moves_hierarchy_and_is_measured_in_bytes() -> None:
    naive, tiled = _feats(NAIVE), _feats(TILED, TS=16)
    assert naive["measured"] == tiled["measured"] == 1.0
    assert naive["shared_bytes"] == 0 and naive["barriers"] == 0
    assert tiled["shared_bytes"] == 2 * 16 * 16 * 4  # two float[16][16] tiles
    assert tiled["shared_accesses"] > 0 and tiled["barriers"] > 0
    assert _cell(TILED, TS=16)["hierarchy"] > _cell(NAIVE)["hierarchy"]
    # re-reads served from work-group memory: more FLOPs per byte of global traffic than the naive loop
    assert tiled["kernel_intensity"] > naive["kernel_intensity"]


@needs_sycl
def test_sub_group_shuffles_move_hierarchy() -> None:
    plain = _feats(ROWSUM.replace("REAL", "float"), SHUFFLE=0)
    shuffled = _feats(ROWSUM.replace("REAL", "float"), SHUFFLE=1)
    assert plain["shuffles"] == 0 < shuffled["shuffles"]
    assert plain["hierarchy"] < shuffled["hierarchy"] == 2


@needs_sycl
def test_fp64_moves_the_mix_axis() -> None:
    single = _cell(ROWSUM.replace("REAL", "float"), SHUFFLE=0)
    double = _cell(ROWSUM.replace("REAL", "double"), SHUFFLE=0)
    assert single["mix"] == 1 and double["mix"] == 3
    assert (single["hierarchy"], single["occupancy"]) == (double["hierarchy"], double["occupancy"])
    assert double["intensity"] <= single["intensity"]  # the same FLOPs over twice the bytes


@needs_sycl
def test_special_functions_are_read_from_opencl_std_ext_insts() -> None:
    """exp and rsqrt are OpExtInst of OpenCL.std (sfu); fma is 2 FLOPs of fp32."""
    body = "c[i] = sycl::exp(v) * sycl::rsqrt(v + 1.f);"
    src = (
        HEADER
        + r"""
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void k(const float* a, float* c) {
    size_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
    float v = a[i];
    BODY
}
"""
    )
    special = _feats(src.replace("BODY", body))
    plain = _feats(src.replace("BODY", "c[i] = sycl::fma(v, v, 1.f);"))
    assert special["sfu_share"] == 0.5 and special["mix"] == 2  # exp, rsqrt; the add and the multiply
    assert plain["sfu_share"] == 0 and plain["mix"] == 1
    assert plain["kernel_intensity"] == 2 / 8  # one fma over a 4-byte load and a 4-byte store


@needs_sycl
def test_occupancy_falls_with_local_memory_per_work_group() -> None:
    small, large = _feats(TILED, TS=8), _feats(TILED, TS=90)
    assert large["shared_bytes"] == 2 * 90 * 90 * 4
    assert small["occupancy"] == 1.0  # 512 bytes: eight or more work-groups fit the device's local memory
    device = runtime().devices[0]  # the CPU device's 256 KiB hold four of the large work-groups
    fits = device["local_mem_bytes"] // (2 * 90 * 90 * 4)
    assert large["occupancy"] == min(1.0, fits / 8) < 1.0
    assert _cell(TILED, TS=8)["occupancy"] > _cell(TILED, TS=90)["occupancy"]


@needs_sycl
def test_spirv_reader_on_the_runtimes_own_binary() -> None:
    from kfoundry.plugins.backends.sycl_artefact import build_artefact

    art = build_artefact(TILED, {"TS": 16})
    assert art.images and art.images[0][:4] == (spirv.MAGIC).to_bytes(4, "little")
    module = spirv.parse(art.images[0])
    assert module.words * 4 == len(art.images[0]) and module.version >= (1, 0)
    (name,) = module.kernels
    assert name.endswith("mm")
    assert module.workgroup_bytes == 2048
    mix = module.mix()
    assert mix.max_depth == 1  # the tile loop; the k loop (TS = 16 iterations) is unrolled into it
    assert mix.flops == 2 * 16 * 8  # 16 multiply-adds, in the loop (weight 8)
    assert mix.get("barrier") == 2 * 8  # two barriers in the tile loop
    assert mix.get("global_load") > 0 and mix.get("global_store") > 0
    # the kernel's device report: work-group size limits and the local memory the OpenCL runtime counts
    report = art.kernels["mm"]
    assert report["max_work_group_size"] > 0 and report["local_mem_bytes"] >= 2048
    assert report["compile_work_group_size"] == [0, 0, 0]
    with pytest.raises(spirv.SpirvError, match="magic"):
        spirv.parse(b"\0" * 20)
    with pytest.raises(spirv.SpirvError, match="word count"):
        spirv.parse(art.images[0][:24])


@needs_sycl
def test_a_kernelbench_candidate_with_a_run_time_shape_macro_is_measured() -> None:
    """The kernel string of a ModelNew is measured; an undefined upper-case macro gets the placeholder."""
    kernel = TILED.replace("int n)", "int unused)").replace("< n;", "< N;").replace("* n", "* N")
    source = f'SRC = r"""{kernel}"""\nclass ModelNew:\n    pass\n'
    feats = _space().features(Candidate(source=source, language="sycl", params={"TS": 16}))
    assert feats["measured"] == 1.0 and feats["shared_bytes"] == 2048


@needs_sycl
def test_a_program_that_does_not_build_is_measured_zero() -> None:
    feats = _feats(
        HEADER + 'extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))\nvoid k( {'
    )
    assert feats["measured"] == 0.0


@needs_sycl
def test_a_program_that_crashes_the_compiler_is_measured_zero_and_the_next_is_measured() -> None:
    """The kernel compiler segfaults on get_work_group_scratch_memory(): the worker dies, not the loop."""
    crash = (
        HEADER
        + r"""
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void k(float* x) {
    auto it = syclext::this_work_item::get_nd_item<1>();
    float* s = static_cast<float*>(syclexp::get_work_group_scratch_memory());
    s[it.get_local_id(0)] = x[it.get_global_id(0)];
    x[it.get_global_id(0)] = s[0];
}
"""
    )
    assert _feats(crash)["measured"] == 0.0
    assert _feats(NAIVE)["measured"] == 1.0


def test_missing_runtime_is_one_warning_and_the_static_patterns(monkeypatch, caplog) -> None:
    import kfoundry.plugins.backends.sycl_runtime as rt

    monkeypatch.setattr(rt, "unavailable_reason", lambda: "sycl: install the sycl extra")
    space = _space()
    with caplog.at_level(logging.WARNING, logger="kfoundry.descriptors"):
        feats = space.features(Candidate(source=TILED, language="sycl", kind="native", params={"TS": 16}))
        space.features(Candidate(source=NAIVE, language="sycl", kind="native"))
    assert feats["measured"] == 0.0
    static = extractor_for("sycl").extract(TILED)
    assert feats["hierarchy"] == static["memory"] and feats["occupancy"] == static["parallelism"]
    assert measure_sycl.measure_sycl([TILED], {}, space.context) is None
    lines = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "sycl" in r.getMessage()
    ]  # an earlier test may have turned on the info lines (-v): only warnings count here
    assert len(lines) <= 1  # once per process (another test may have said it already)
