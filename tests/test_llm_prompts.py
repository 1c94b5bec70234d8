"""Prompt rendering: hardware-aware, per backend language, with parent feedback and sections."""

from __future__ import annotations

import pytest
from llm_server import vecadd

from kfoundry.core.generator import Attempt, GenerationRequest, ProblemSummary
from kfoundry.core.llm.prompts import PromptBuilder
from kfoundry.core.llm.provider import parse_ranking
from kfoundry.core.models import Candidate, DeviceProfile, EvalRecord, Outcome, Proposal, TimingStats

H200 = DeviceProfile(
    backend="cuda",
    name="NVIDIA H200",
    device_type="gpu",
    compute_units=132,
    warp_size=32,
    compute_capability="9.0",
    max_work_group_size=1024,
    local_mem_bytes=49152,
    shared_mem_per_sm=233472,
    registers_per_block=65536,
    registers_per_sm=65536,
    l2_cache_bytes=60 * 2**20,
    peak_bandwidth_gbs=4300.0,
    peak_gflops=60000.0,
    peaks_measured=True,
)
POCL = DeviceProfile(
    backend="opencl",
    name="pthread-cpu",
    device_type="cpu",
    compute_units=2,
    max_work_group_size=4096,
    local_mem_bytes=4 * 2**20,
    sub_group_sizes=[8, 16],
    peak_bandwidth_gbs=12.5,
)


def timing(ms: float) -> TimingStats:
    return TimingStats(
        median_ms=ms,
        iqr_ms=ms / 20,
        ci95_low_ms=ms * 0.98,
        ci95_high_ms=ms * 1.02,
        mean_ms=ms,
        min_ms=ms * 0.9,
        n=30,
    )


def failed_parent() -> Attempt:
    rec = EvalRecord(
        candidate_hash="h",
        eval_key="k",
        problem="vadd",
        backend="opencl",
        device="pocl",
        outcome=Outcome.compile_error,
        message="build failed",
        log="<source>:4:9: error: use of undeclared identifier 'WORKK'",
        resources={"vadd": {"registers": 40}},
    )
    return Attempt(
        candidate=Candidate(source=vecadd(64, 2), params={"BLOCK": 64, "WORK": 2}), record=rec, cell=(1, 0, 0)
    )


def slow_parent() -> Attempt:
    rec = EvalRecord(
        candidate_hash="h2",
        eval_key="k2",
        problem="vadd",
        backend="cuda",
        device="h200",
        outcome=Outcome.correct,
        timing=timing(2.0),
        reference_timing=timing(3.0),
        speedup=1.5,
        roofline_fraction=0.31,
    )
    return Attempt(candidate=Candidate(source=vecadd(256, 1)), record=rec, cell=(0, 0, 0))


def req(device: DeviceProfile, language: str, **kw: object) -> GenerationRequest:
    problem = ProblemSummary(
        name="vadd",
        reference_source="class Model: ...  # a + b",
        shapes={"N": 1 << 20},
        input_shapes=[[1 << 20], [1 << 20]],
        input_dtypes=["float32", "float32"],
        output_shapes=[[1 << 20]],
        bytes_moved=12 << 20,
        flops=float(1 << 20),
    )
    return GenerationRequest(problem=problem, language=language, device=device, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("language", ["opencl", "cuda", "hip", "sycl"])
def test_every_language_template_teaches_the_runtime_and_the_device(language: str) -> None:
    prompt = PromptBuilder().generation(req(H200, language))
    text = prompt.user
    assert "from kfoundry.runtime import cdiv, load" in text and "class ModelNew" in text
    assert 'load(SRC, defines={"BLOCK": BLOCK})' in text and 'PARAMS.get("BLOCK", 256)' in text
    assert "TUNABLE = {" in text and "grid=" in text and "block=" in text
    assert "NVIDIA H200" in text and "132" in text and "4300 GB/s (measured)" in text
    assert "## Reference" in text and "`N = 1048576`" in text and "float32" in text
    assert "Roofline bound" in text  # bytes over bandwidth
    assert language.upper() in prompt.system
    assert "{{" not in text and "{%" not in text


def test_cuda_prompt_uses_warp_vocabulary_and_cp_async_on_hopper() -> None:
    text = PromptBuilder().generation(req(H200, "cuda")).user
    assert "warp of 32 threads" in text and "__shfl_down_sync" in text and "cp.async" in text
    assert "65536 registers per SM" in text and "60.0 MiB" in text


def test_opencl_cpu_prompt_mentions_sub_groups_and_cpu_advice() -> None:
    text = PromptBuilder().generation(req(POCL, "opencl")).user
    assert "sub-group" in text and "size 8/16" in text and "CPU OpenCL device" in text
    assert (
        ", size)"
        not in PromptBuilder()
        .generation(req(POCL.model_copy(update={"sub_group_sizes": None}), "opencl"))
        .user
    )


def test_repair_prompt_carries_the_compile_log_resources_and_parent_source() -> None:
    text = PromptBuilder().generation(req(POCL, "opencl", mode="repair", parent=failed_parent())).user
    assert "repair the parent" in text and "**compile_error**" in text
    assert "undeclared identifier 'WORKK'" in text and "registers" in text
    assert vecadd(64, 2).strip() in text and "<<<<<<< SEARCH" in text


def test_improve_prompt_has_time_speedup_inspirations_target_and_sections() -> None:
    r = req(
        H200,
        "cuda",
        mode="improve",
        parent=slow_parent(),
        inspirations=[failed_parent()],
        target_cell=(2, 1, 2),
        prompt_sections={"pitfalls": "- Never forget the tail.", "extra_advice": "Think in bytes."},
    )
    text = PromptBuilder().generation(r).user
    assert (
        "median 2 ms" in text
        and "reference 3 ms" in text
        and "speedup 1.50x" in text
        and "31% of the roofline" in text
    )
    assert "### Inspiration 1 (cell [1, 0, 0]): compile_error" in text
    assert (
        "memory level 2: local-memory tiling" in text
        and "parallelism level 2: sub-group / warp intrinsics" in text
    )
    assert (
        "## Common pitfalls\n- Never forget the tail." in text and "## Extra advice\nThink in bytes." in text
    )


def test_template_override_directory(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "system.j2").write_text("Custom system for {{ language }}.")
    prompt = PromptBuilder(str(tmp_path)).generation(req(POCL, "opencl"))
    assert prompt.system == "Custom system for opencl.\n"


def test_ranking_prompt_and_parse() -> None:
    props = [Proposal(candidate=Candidate(source=vecadd(b)), generator="g") for b in (32, 64, 128)]
    text = PromptBuilder().ranking(req(POCL, "opencl"), props).user
    assert text.count("## Candidate ") == 3 and "RANKING: 1 > 2 > 3" in text
    assert parse_ranking("thinking...\nRANKING: 3 > 1 > 2", 3) == [2, 0, 1]
    assert parse_ranking("RANKING: 2, 2, 9", 3) == [
        1,
        0,
        2,
    ]  # duplicates and out-of-range dropped, rest appended
    assert parse_ranking("no ranking here", 3) is None


def test_prompt_descriptor_names_follow_the_archive_axes() -> None:
    from kfoundry.core.descriptors import AXES, LEVELS
    from kfoundry.core.llm.prompts import DESCRIPTORS

    assert [name for name, _ in DESCRIPTORS] == list(AXES)
    assert all(len(levels) == LEVELS for _, levels in DESCRIPTORS)


def test_stable_prefix_is_shared_by_every_request_of_a_run() -> None:
    b = PromptBuilder()
    prompts = [
        b.generation(req(POCL, "opencl")),
        b.generation(req(POCL, "opencl", mode="repair", parent=failed_parent())),
        b.generation(req(POCL, "opencl", mode="improve", parent=slow_parent(), target_cell=(1, 2, 3))),
    ]
    prefixes = {p.stable_prefix for p in prompts}
    assert len(prefixes) == 1 and len(prefixes.pop()) > 3000
    for p in prompts:
        rest = p.user[len(p.stable_prefix) :]
        assert rest.startswith("# Task: ") and "## Answer format" in rest
