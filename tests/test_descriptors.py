"""Static behaviour descriptors: levels read from real kernel sources, plugins per language."""

from __future__ import annotations

from kfoundry.core.descriptors import (
    cuda_descriptors,
    get_extractor,
    kernel_text,
    measured_descriptors,
    opencl_descriptors,
)
from kfoundry.core.models import EvalRecord, Outcome

NAIVE_CL = """
__kernel void add(__global const float* a, __global const float* b, __global float* c, int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];   // vload4 and barrier( are only mentioned in this comment
}
"""

TILED_CL = """
__kernel void mm(__global const float* A, __global const float* B, __global float* C, int N) {
    __local float As[TS][TS];
    __local float Bs[TS][TS];
    float acc = 0.0f;
    for (int t = 0; t < N; t += TS) {
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; ++k) acc = fma(As[0][k], Bs[k][0], acc);
    }
    C[0] = acc;
}
"""

WARP_CU = """
extern "C" __global__ void rows(const float* __restrict__ x, float* y) {
    __shared__ float sh[32];
    float4 q = reinterpret_cast<const float4*>(x)[threadIdx.x];
    float cache[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i) cache[i] = 0.f;
    float running_max = q.x;
    for (int o = 16; o > 0; o >>= 1) running_max = fmaxf(running_max, __shfl_xor_sync(0xffffffffu, running_max, o));
    __syncthreads();
    y[0] = running_max + cache[0] + sh[0];
}
"""


def test_naive_kernel_is_the_origin_and_comments_do_not_count() -> None:
    assert opencl_descriptors().extract(NAIVE_CL) == {"memory": 0, "compute": 0, "parallelism": 0}


def test_local_tiling_with_barriers() -> None:
    assert opencl_descriptors().cell(TILED_CL) == (2, 3, 1)


def test_cuda_warp_and_block_hierarchy() -> None:
    d = cuda_descriptors().extract(WARP_CU)
    assert d == {"memory": 3, "compute": 2, "parallelism": 3}


def test_kernel_text_reads_the_kernel_inside_a_modelnew() -> None:
    source = f'"""Uses __local memory and barriers, says the docstring."""\nSRC = r"""{NAIVE_CL}"""\nclass ModelNew: pass\n'
    assert "get_global_id" in kernel_text(source)
    assert "docstring" not in kernel_text(source)
    assert opencl_descriptors().cell(source) == (0, 0, 0)


def test_extractors_are_plugins(kf_plugin_manager, caplog) -> None:
    assert set(kf_plugin_manager.registry("descriptor").names()) >= {"opencl", "cuda", "hip", "sycl"}
    assert get_extractor("cuda", kf_plugin_manager).cell(WARP_CU) == (3, 2, 3)
    assert get_extractor("hip", kf_plugin_manager).cell(WARP_CU.replace("_sync(0xffffffffu, ", "(")) == (
        3,
        2,
        3,
    )
    with caplog.at_level("WARNING", logger="kfoundry.descriptors"):
        assert get_extractor("metal", kf_plugin_manager).cell(TILED_CL) == (
            2,
            3,
            1,
        )  # the C patterns, said so
    lines = [r.getMessage() for r in caplog.records if "metal" in r.getMessage()]
    assert len(lines) == 1 and "no extractor registered for language 'metal'" in lines[0]
    assert "\n" not in lines[0]


def test_measured_descriptors_from_a_record() -> None:
    record = EvalRecord(
        candidate_hash="h",
        eval_key="k",
        problem="p",
        backend="cuda",
        device="d",
        outcome=Outcome.correct,
        roofline_fraction=0.8,
        resources={"rows": {"registers": 40}, "other": {"registers": 32}},
    )
    assert measured_descriptors(record) == {"roofline_fraction": 0.8, "registers": 40.0}


def test_descriptors_survive_without_the_offline_plugin(monkeypatch, caplog) -> None:
    """The backends register their languages' descriptors: disabling the offline generator changes nothing."""
    from kfoundry.core.plugins import PluginManager

    monkeypatch.setenv("KF_DISABLE_PLUGINS", "offline")
    manager = PluginManager()
    manager.load_entry_points()
    assert "offline" not in manager.registry("llm")
    with caplog.at_level("WARNING", logger="kfoundry.descriptors"):
        extractor = get_extractor("cuda", manager)
    assert extractor.cell(WARP_CU) == (3, 2, 3)
    assert extractor.measurer is not None
    assert not [r for r in caplog.records if "cuda" in r.getMessage()]
    specs = {s.name: s.plugin for s in manager.registry("descriptor")}
    assert specs == {"cuda": "cuda", "hip": "hip", "opencl": "opencl", "sycl": "sycl", "triton": "triton"}


def test_descriptor_choice_in_the_search_options(kf_config) -> None:
    import pytest
    from pydantic import ValidationError

    from kfoundry.core.behaviour.space import build_space
    from kfoundry.core.config import build_plugin

    config = kf_config(
        {"search": {"options": {"descriptors": ["hierarchy", {"name": "occupancy", "edges": [0.5]}]}}}
    )
    strategy = build_plugin(config.search, "search")
    space = build_space("cuda", strategy.options.descriptors)
    assert space.names == ("hierarchy", "occupancy") and space.dims == (4, 2)
    assert build_space("opencl", "static").dims == (4, 4, 4)
    for bad, words in (
        (["hierarchy", "flux"], "unknown descriptor axis 'flux'"),
        ([{"name": "mix", "edges": [2, 1]}], "strictly ascending"),
        (["mix", "mix"], "repeat"),
    ):
        with pytest.raises((ValidationError, Exception)) as info:
            build_plugin(kf_config({"search": {"options": {"descriptors": bad}}}).search, "search")
        assert words in str(info.value)


def test_prompts_describe_the_target_cell_in_the_run_space() -> None:
    from kfoundry.core.behaviour.axes import describe, resolve
    from kfoundry.core.generator import GenerationRequest, ProblemSummary
    from kfoundry.core.llm.prompts import PromptBuilder
    from kfoundry.core.models import DeviceProfile

    problem = ProblemSummary(
        name="vadd",
        reference_source="class Model: ...",
        shapes={"N": 64},
        input_shapes=[[64]],
        input_dtypes=["float32"],
        output_shapes=[[64]],
        bytes_moved=512,
        flops=64.0,
    )
    device = DeviceProfile(backend="cuda", name="H200", device_type="gpu")
    request = GenerationRequest(
        problem=problem,
        language="cuda",
        device=device,
        target_cell=(1, 2, 3, 0),
        extra={"descriptors": describe(resolve("measured"))},
    )
    text = PromptBuilder().generation(request).user
    assert "- hierarchy level 2: shared/local memory or warp shuffles" in text
    assert "- mix level 3: fp64 or tensor-core instructions" in text
    assert "- occupancy level 0: below 0.25 theoretical occupancy" in text
    static = request.model_copy(update={"extra": {}, "target_cell": (2, 0, 1)})
    assert "- memory level 2: local-memory tiling" in PromptBuilder().generation(static).user


def test_the_opencl_compilers_report_reaches_the_record() -> None:
    """pyopencl's work-group info and the program binary's size, from a real PoCL build, as record features."""
    from kfoundry.plugins.backends.opencl import OpenCLBackend

    backend = OpenCLBackend()
    backend.select_device()
    module = backend.load(TILED_CL.replace("TS", "8"))
    report = module.resources["mm"]
    # PoCL counts only __local kernel arguments here (0 for arrays declared in the kernel; clang's IR has them)
    assert report["binary_bytes"] > 0 and report["local_mem_bytes"] is not None
    record = EvalRecord(
        candidate_hash="h",
        eval_key="k",
        problem="p",
        backend="opencl",
        device="d",
        outcome=Outcome.correct,
        resources=module.resources,
    )
    feats = measured_descriptors(record)
    assert (
        feats["binary_bytes"] == report["binary_bytes"]
        and feats["local_mem_bytes"] == report["local_mem_bytes"]
    )
    assert "preferred_multiple" in feats and "private_mem_bytes" in feats
