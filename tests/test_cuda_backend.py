"""CUDA backend: real NVRTC/nvcc compiles and resource reports here; launches only with a GPU."""

from __future__ import annotations

import shutil

import pytest

from kfoundry.core.backend import CompileFailed
from kfoundry.core.errors import BackendUnavailable
from kfoundry.plugins.backends.cuda import CudaBackend, CudaOptions
from kfoundry.plugins.backends.cuda_compile import (
    choose_arch,
    define_flags,
    kernel_short_name,
    nvrtc_available,
    parse_ptxas_report,
)
from kfoundry.plugins.backends.cuda_launch import driver_device_count, is_sticky_error

HAS_NVRTC = nvrtc_available()[0]
HAS_NVCC = shutil.which("nvcc") is not None
HAS_GPU = driver_device_count()[0] > 0
needs_nvrtc = pytest.mark.skipif(not HAS_NVRTC, reason="NVRTC not installed (pip install 'kfoundry[cuda]')")
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on the PATH")

ADD = r"""
extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

# A run-time-indexed private array too large for registers: ptxas must put it on the stack.
STACKY = r"""
extern "C" __global__ void stacky(float* out, const int* idx) {
    float buf[512];
    for (int i = 0; i < 512; ++i) buf[i] = out[i] * 2.0f;
    out[threadIdx.x] = buf[idx[threadIdx.x]];
}
"""

TEMPLATED = r"""
#ifndef BLOCK
#error "BLOCK must be defined"
#endif
__global__ void fill(float* x, float v) { __shared__ float t[BLOCK]; t[threadIdx.x] = v; __syncthreads(); x[threadIdx.x] = t[threadIdx.x]; }
"""


@pytest.fixture(params=[pytest.param("nvrtc", marks=needs_nvrtc), pytest.param("nvcc", marks=needs_nvcc)])
def backend(request: pytest.FixtureRequest) -> CudaBackend:
    return CudaBackend(CudaOptions(compiler=request.param, compile_only=True))


def test_compile_reports_resources(backend: CudaBackend) -> None:
    module = backend.load(ADD)
    assert module.kernel_names == ["add"]
    report = module.resources["add"]
    assert report["registers"] > 0
    assert report["spill_stores"] == 0 and report["stack_bytes"] == 0
    assert report["arch"] == "sm_90"
    assert module.compile_time_s > 0
    assert "Compiling entry function 'add'" in module.log


def test_stack_frame_and_shared_memory_are_reported(backend: CudaBackend) -> None:
    assert backend.load(STACKY).resources["stacky"]["stack_bytes"] >= 512 * 4
    shared = backend.load(TEMPLATED, defines={"BLOCK": 128}).resources["fill"]
    assert shared["shared_bytes"] == 128 * 4 and shared["barriers"] == 1


def test_defines_change_the_program(backend: CudaBackend) -> None:
    small = backend.load(TEMPLATED, defines={"BLOCK": 32}).resources["fill"]["shared_bytes"]
    large = backend.load(TEMPLATED, defines={"BLOCK": 1024}).resources["fill"]["shared_bytes"]
    assert (small, large) == (32 * 4, 1024 * 4)
    with pytest.raises(CompileFailed) as err:
        backend.load(TEMPLATED)
    assert "BLOCK must be defined" in err.value.log


def test_compile_error_carries_the_log(backend: CudaBackend) -> None:
    with pytest.raises(CompileFailed) as err:
        backend.load('extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }')
    assert "undefined_name" in str(err.value)
    assert "error" in err.value.log


def test_arch_option_and_sm90a_selection(backend: CudaBackend) -> None:
    backend.options.arch = "sm_80"
    assert backend.load(ADD).resources["add"]["arch"] == "sm_80"
    assert choose_arch(None, ADD) == "sm_90"
    assert choose_arch("9.0", 'asm volatile("wgmma.fence.sync.aligned;");') == "sm_90a"
    assert choose_arch("8.6", ADD) == "sm_86"


def test_wgmma_compiles_for_sm90a(backend: CudaBackend) -> None:
    src = 'extern "C" __global__ void k(float* x) { asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory"); x[0] = 1.f; }'
    assert backend.load(src).resources["k"]["arch"] == "sm_90a"


@pytest.mark.skipif(HAS_GPU, reason="this machine has a CUDA device")
def test_launch_without_device_says_so_in_one_line(backend: CudaBackend) -> None:
    module = backend.load(ADD)
    with pytest.raises(BackendUnavailable) as err:
        module.add(1, 2, 3, 4, grid=(1,), block=(1,))
    assert "no CUDA device is present" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(BackendUnavailable):
        backend.synchronize()


def test_capabilities_and_toolchain_here() -> None:
    caps = CudaBackend().capabilities()
    assert caps.can_compile == (HAS_NVRTC or HAS_NVCC)
    assert caps.can_run == HAS_GPU
    if not HAS_GPU:
        assert caps.reason.startswith("compile-only")
    version = CudaBackend().toolchain_version()
    assert "nvrtc" in version or "nvcc" in version


def test_ptxas_report_parsing_and_names() -> None:
    log = """ptxas info    : Compiling entry function '_Z6kernelPfi' for 'sm_90'
ptxas info    : Function properties for _Z6kernelPfi
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 368 bytes cmem[0]
"""
    assert parse_ptxas_report(log) == {
        "kernel": {
            "stack_bytes": 16,
            "spill_stores": 8,
            "spill_loads": 4,
            "registers": 40,
            "barriers": 1,
            "shared_bytes": 2048,
            "const_bytes": 368,
        }
    }
    assert kernel_short_name("_Z3addPKfS0_Pfi") == "add"
    assert kernel_short_name("softmax_rows") == "softmax_rows"
    assert define_flags({"A": 3, "FLAG": True, "X": 1.5}) == ["-DA=3", "-DFLAG=1", "-DX=1.5"]
    with pytest.raises(CompileFailed):
        define_flags({"bad name": 1})


def test_sticky_error_classification() -> None:
    assert is_sticky_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_sticky_error(RuntimeError("launching k failed: CUDA_ERROR_ILLEGAL_ADDRESS: ..."))
    assert not is_sticky_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))


def test_plugin_registration(kf_plugin_manager) -> None:  # type: ignore[no-untyped-def]
    spec = kf_plugin_manager.get("backend", "cuda")
    backend = spec.build({"compiler": "auto", "compile_only": True})
    assert isinstance(backend, CudaBackend) and backend.language == "cuda"
    with pytest.raises(ValueError):
        spec.build({"compiller": "nvrtc"})


def test_argument_packing_without_a_device() -> None:
    """Launch arguments are packed by the parameter's size; an int that does not fit is refused, not wrapped."""
    import ctypes

    import numpy as np
    import torch

    from kfoundry.plugins.backends.cuda_launch import CudaLaunchError, _pack_all

    packed = _pack_all((7, -3, 2**40, 1.5, np.float32(2.0), True), [4, 4, 8, 4, 4, 4], torch.Tensor)
    assert [type(p) for p in packed[:4]] == [ctypes.c_int32, ctypes.c_int32, ctypes.c_int64, ctypes.c_float]
    assert [p.value for p in packed[:4]] == [7, -3, 2**40, 1.5]
    assert bytes(packed[4]) == np.float32(2.0).tobytes()
    assert packed[5].value == 1
    assert _pack_all((2**32 - 1,), [4], torch.Tensor)[0].value == -1  # unsigned spelling: same bits
    with pytest.raises(CudaLaunchError, match="argument 0: 4294967296 does not fit a 4-byte parameter"):
        _pack_all((2**32,), [4], torch.Tensor)
    with pytest.raises(CudaLaunchError, match="argument 1: -129 does not fit a 1-byte parameter"):
        _pack_all((1, -129), [4, 1], torch.Tensor)
    with pytest.raises(CudaLaunchError, match="argument 0: a cpu tensor"):
        _pack_all((torch.zeros(2),), [8], torch.Tensor)
    with pytest.raises(CudaLaunchError, match="argument 0: an int for a 3-byte parameter"):
        _pack_all((1,), [3], torch.Tensor)


def test_launch_dimensions_are_bounded() -> None:
    """A grid size the driver's 32-bit dimensions cannot hold is refused before the launch, never wrapped."""
    from kfoundry.plugins.backends.cuda_launch import CudaLaunchError, _dims

    assert _dims(5, "grid") == (5, 1, 1) and _dims((2, 3), "block") == (2, 3, 1)
    for bad in (0, 1 << 31, (1, 1 << 32), (1, 2, 3, 4)):
        with pytest.raises(CudaLaunchError, match="grid must be 1 to 3 positive sizes"):
            _dims(bad, "grid")
