"""HIP backend: real hipcc compiles for AMD targets and resource reports; never a launch (no AMD GPU)."""

from __future__ import annotations

import shutil

import pytest
from eval_helpers import EXAMPLES
from pydantic import ValidationError

from kfoundry import runtime
from kfoundry.core.backend import CompileFailed, KernelModule
from kfoundry.core.config import load_config
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.evaluation import Evaluator
from kfoundry.core.models import Candidate
from kfoundry.core.plugins import PluginManager
from kfoundry.core.problem import load_problem
from kfoundry.plugins.backends import hip as hip_module
from kfoundry.plugins.backends.hip import (
    NO_DEVICE,
    NO_HIPCC,
    HipBackend,
    HipOptions,
    merge_reports,
    parse_metadata_notes,
    parse_remarks,
)

HAS_HIPCC = shutil.which("hipcc") is not None
needs_hipcc = pytest.mark.skipif(not HAS_HIPCC, reason=NO_HIPCC)

SEED = (EXAMPLES / "kernelbench" / "seeds" / "vector_add_hip.py").read_text()

ADD = r"""
#include <hip/hip_runtime.h>
extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

# LDS sized by a define, a barrier, and a reduction over a 64-wide wavefront (AMD semantics).
WAVE_REDUCE = r"""
#include <hip/hip_runtime.h>
#ifndef BLOCK
#error "BLOCK must be defined"
#endif
#if __AMDGCN_WAVEFRONT_SIZE != 64
#error "expected 64-wide wavefronts"
#endif
static_assert(sizeof(__ballot(1)) == 8, "a ballot covers 64 lanes");

extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ out) {
    __shared__ float partial[BLOCK / 64];
    float v = x[blockIdx.x * BLOCK + threadIdx.x];
    for (int off = warpSize / 2; off > 0; off >>= 1) v += __shfl_down(v, off);
    if (threadIdx.x % warpSize == 0) partial[threadIdx.x / warpSize] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (int w = 0; w < BLOCK / 64; ++w) s += partial[w];
        out[blockIdx.x] = s;
    }
}
"""

# A run-time-indexed private array too large for registers: it must live in scratch.
SCRATCHY = r"""
extern "C" __global__ void scratchy(float* out, const int* idx) {
    float buf[512];
    for (int i = 0; i < 512; ++i) buf[i] = out[i] * 2.0f;
    out[threadIdx.x] = buf[idx[threadIdx.x]];
}
"""

TEMPLATED = r"""
template <int K> __global__ void times(float* x) { x[threadIdx.x] *= K; }
template __global__ void times<3>(float*);
template __global__ void times<5>(float*);
__global__ void plain(float* x) { x[threadIdx.x] = 1.f; }
"""


@pytest.fixture
def backend() -> HipBackend:
    return HipBackend()


@needs_hipcc
def test_vector_add_compiles_with_a_resource_report(backend: HipBackend) -> None:
    module = backend.load(ADD)
    assert module.kernel_names == ["add"]
    report = module.resources["add"]
    assert 0 < report["registers"] <= 32 and 0 < report["sgprs"] <= 32
    assert report["shared_bytes"] == 0 and report["stack_bytes"] == 0
    assert report["vgpr_spills"] == 0 and report["sgpr_spills"] == 0
    assert report["wavefront_size"] == 64 and 1 <= report["occupancy_waves_per_simd"] <= 10
    assert report["arch"] == "gfx90a" and report["compiler"] == "hipcc"
    assert 0 < module.compile_time_s < 60
    assert "kernel-resource-usage" in module.log


@needs_hipcc
def test_shared_memory_barrier_and_wavefront_shuffles(backend: HipBackend) -> None:
    report = backend.load(WAVE_REDUCE, defines={"BLOCK": 256}).resources["block_sum"]
    assert report["shared_bytes"] == (256 // 64) * 4
    assert report["registers"] > 0 and report["wavefront_size"] == 64


@needs_hipcc
def test_defines_change_the_resource_report(backend: HipBackend) -> None:
    small = backend.load(WAVE_REDUCE, defines={"BLOCK": 64}).resources["block_sum"]["shared_bytes"]
    large = backend.load(WAVE_REDUCE, defines={"BLOCK": 1024}).resources["block_sum"]["shared_bytes"]
    assert (small, large) == (4, 64)
    with pytest.raises(CompileFailed) as err:
        backend.load(WAVE_REDUCE)
    assert "BLOCK must be defined" in err.value.log


@needs_hipcc
def test_scratch_is_reported_as_stack(backend: HipBackend) -> None:
    report = backend.load(SCRATCHY).resources["scratchy"]
    assert report["stack_bytes"] >= 512 * 4


@needs_hipcc
def test_compile_error_carries_the_log(backend: HipBackend) -> None:
    with pytest.raises(CompileFailed) as err:
        backend.load('extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }')
    assert "undefined_name" in str(err.value) and "error" in str(err.value)
    assert "error generated when compiling for gfx90a" in err.value.log


@needs_hipcc
def test_kernels_found_by_source_name(backend: HipBackend) -> None:
    module = backend.load(TEMPLATED)
    assert module.kernel_names == ["_Z5timesILi5EEvPf", "plain", "times"]
    assert module.resources["times"]["symbol"] == "_Z5timesILi3EEvPf"
    with pytest.raises(AttributeError, match="no kernel named 'nope'"):
        module.nope  # noqa: B018


@needs_hipcc
@pytest.mark.parametrize("arch", ["gfx908", "gfx940"])
def test_other_targets(arch: str) -> None:
    report = HipBackend(HipOptions(arch=arch)).load(ADD).resources["add"]
    assert report["arch"] == arch and report["registers"] > 0


@needs_hipcc
def test_calling_a_kernel_says_no_device_in_one_line(backend: HipBackend) -> None:
    module = backend.load(ADD)
    with pytest.raises(BackendUnavailable) as err:
        module.add(1, 2, 3, 4, grid=(1,), block=(64,))
    assert str(err.value) == "hip: cannot run kernel add: no AMD GPU device is present (compile-only)"
    backend.synchronize()  # a no-op: nothing is ever queued


@needs_hipcc
def test_capabilities_and_toolchain_here(backend: HipBackend) -> None:
    caps = backend.capabilities()
    assert caps.can_compile and not caps.can_run and caps.reason == NO_DEVICE
    assert backend.toolchain_version().startswith("hipcc HIP ")
    assert backend.devices() == []
    with pytest.raises(BackendUnavailable, match="no AMD GPU"):
        backend.require_device()


def test_missing_hipcc_is_reported() -> None:
    backend = HipBackend(HipOptions(hipcc="/nonexistent/hipcc"))
    caps = backend.capabilities()
    assert (caps.can_compile, caps.can_run, caps.reason) == (False, False, NO_HIPCC)
    with pytest.raises(BackendUnavailable, match="hipcc not found"):
        backend.load(ADD)
    assert backend.toolchain_version() == "no hipcc"


def test_options_are_validated() -> None:
    assert HipOptions(arch="gfx90a:xnack+").arch == "gfx90a:xnack+"
    with pytest.raises(ValidationError):
        HipOptions(arch="sm_90")
    with pytest.raises(ValidationError):
        HipOptions.model_validate({"archh": "gfx90a"})


NOTES = """Displaying notes found in: .note
  Owner                Data size \tDescription
  AMDGPU               0x0000049c\tNT_AMDGPU_METADATA (AMDGPU Metadata)
    AMDGPU Metadata:
        ---
amdhsa.kernels:
  - .agpr_count:     0
    .args:
      - .address_space:  global
        .offset:         0
        .size:           8
        .value_kind:     global_buffer
    .group_segment_fixed_size: 16
    .kernarg_segment_size: 20
    .language:       OpenCL C
    .max_flat_workgroup_size: 1024
    .name:           _Z6rowsumPKfPfi
    .private_segment_fixed_size: 32
    .sgpr_count:     16
    .sgpr_spill_count: 1
    .symbol:         _Z6rowsumPKfPfi.kd
    .uses_dynamic_stack: false
    .vgpr_count:     8
    .vgpr_spill_count: 2
    .wavefront_size: 64
amdhsa.target:   amdgcn-amd-amdhsa--gfx90a
"""

REMARKS = """k.hip:9:1: remark: Function Name: _Z6rowsumPKfPfi [-Rpass-analysis=kernel-resource-usage]
extern "C" __global__ void rowsum(const float* __restrict__ x, float* __restrict__ out, int n) {
^
k.hip:9:1: remark:     SGPRs: 16 [-Rpass-analysis=kernel-resource-usage]
k.hip:9:1: remark:     VGPRs: 8 [-Rpass-analysis=kernel-resource-usage]
k.hip:9:1: remark:     ScratchSize [bytes/lane]: 32 [-Rpass-analysis=kernel-resource-usage]
k.hip:9:1: remark:     Occupancy [waves/SIMD]: 8 [-Rpass-analysis=kernel-resource-usage]
k.hip:9:1: remark:     LDS Size [bytes/block]: 16 [-Rpass-analysis=kernel-resource-usage]
"""


def test_metadata_and_remark_parsing() -> None:
    meta = parse_metadata_notes(NOTES)
    assert meta == {
        "_Z6rowsumPKfPfi": {
            "agprs": 0,
            "shared_bytes": 16,
            "kernarg_bytes": 20,
            "max_threads_per_block": 1024,
            "stack_bytes": 32,
            "sgprs": 16,
            "sgpr_spills": 1,
            "uses_dynamic_stack": False,
            "registers": 8,
            "vgpr_spills": 2,
            "wavefront_size": 64,
        }
    }
    remarks = parse_remarks(REMARKS)
    assert remarks == {
        "_Z6rowsumPKfPfi": {
            "sgprs": 16,
            "registers": 8,
            "stack_bytes": 32,
            "occupancy_waves_per_simd": 8,
            "shared_bytes": 16,
        }
    }
    merged = merge_reports(meta, remarks)["_Z6rowsumPKfPfi"]
    assert merged["occupancy_waves_per_simd"] == 8 and merged["vgpr_spills"] == 2
    assert merge_reports(None, remarks) == remarks  # no llvm-readelf: the remarks alone


def _with_hip(manager: PluginManager) -> PluginManager:
    if "hip" not in manager.registry("backend"):  # until the entry point is in pyproject.toml
        manager.add_plugin(hip_module, "hip", package="kfoundry")
    return manager


def test_plugin_registration(kf_plugin_manager: PluginManager) -> None:
    spec = _with_hip(kf_plugin_manager).get("backend", "hip")
    backend = spec.build({"arch": "gfx940"})
    assert isinstance(backend, HipBackend) and backend.language == "hip" and backend.options.arch == "gfx940"
    with pytest.raises(ValidationError):
        spec.build({"arc": "gfx90a"})


@needs_hipcc
def test_seed_compiles_and_says_no_amd_gpu_when_run(
    kf_plugin_manager: PluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_hip(kf_plugin_manager)
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 4096})
    backend = HipBackend()
    monkeypatch.setattr(runtime, "_active", backend)
    model = problem.build_candidate(
        Candidate(source=SEED, language="hip", params={"BLOCK": 128}), runtime.load
    )
    module = model.k  # compiled by the candidate's own kfoundry.runtime.load, on the active backend
    assert isinstance(module, KernelModule)
    assert module.kernel_names == ["vector_add"] and module.resources["vector_add"]["registers"] > 0
    with pytest.raises(BackendUnavailable) as err:
        model(*problem.make_inputs(0))
    assert "no AMD GPU device is present" in str(err.value)

    # The evaluator refuses in one line, exactly as for compile-only CUDA.
    config = load_config(data={"backend": {"name": "hip"}}, validate_plugins=False)
    with pytest.raises(BackendUnavailable) as refused:
        Evaluator(problem, config)
    assert str(refused.value) == f"backend hip cannot run kernels here: {NO_DEVICE}"
    assert "no AMD GPU" in str(refused.value)
