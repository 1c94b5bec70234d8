"""The OpenCL backend on PoCL: devices, compilation and its log, zero-copy launches, launch errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from kfoundry import runtime
from kfoundry.core.backend import CompileFailed
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.hardware import detect_devices
from kfoundry.plugins.backends.opencl import LaunchError, OpenCLBackend, OpenCLHardware, OpenCLOptions

ADD = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
__kernel void scale2d(__global float* x, const int w, const float s) {
    int col = get_global_id(0), row = get_global_id(1);
    x[row * w + col] *= s * FACTOR;
}
"""


@pytest.fixture(scope="module")
def backend() -> Iterator[OpenCLBackend]:
    b = OpenCLBackend()
    if not b.capabilities().can_run:
        pytest.skip(b.capabilities().reason)
    b.select_device(None)
    yield b


def test_devices_and_profile(backend: OpenCLBackend) -> None:
    devices = backend.devices()
    assert devices and devices[0].backend == "opencl"
    d = devices[0]
    assert d.max_work_group_size and d.compute_units and d.local_mem_bytes and d.global_mem_bytes
    assert "pyopencl" in backend.toolchain_version()
    assert backend.select_device(d.name[:5].lower()).name == d.name
    with pytest.raises(BackendUnavailable, match="no device matching"):
        backend.select_device("no-such-device")
    with pytest.raises(BackendUnavailable, match="no device 99"):
        backend.select_device(99)
    backend.select_device(0)


def test_hardware_detector_registered() -> None:
    profiles = detect_devices("opencl")
    assert profiles and profiles[0].name == OpenCLBackend().devices()[0].name
    assert OpenCLHardware().detect("cuda") == []


def test_zero_copy_launch_and_defines(backend: OpenCLBackend) -> None:
    mod = backend.load(ADD, defines={"FACTOR": 2.0})
    assert mod.kernel_names == ["add", "scale2d"]
    assert mod.resources["add"]["max_work_group_size"] >= 1
    a, b = torch.rand(1000), torch.rand(1000)
    c = torch.full((1000,), float("nan"))
    mod.add(a, b, c, 1000, grid=(16,), block=(64,))
    backend.synchronize()
    assert torch.equal(c, a + b)
    x = torch.rand(8, 12)
    expected = x * 3.0 * 2.0
    mod.scale2d(x, 12, 3.0, grid=(3, 2), block=(4, 4))
    backend.synchronize()
    assert torch.allclose(x, expected)


def test_local_memory_argument(backend: OpenCLBackend) -> None:
    src = r"""
    __kernel void block_sum(__global const float* x, __global float* out, __local float* scratch) {
        int l = get_local_id(0), g = get_group_id(0), n = get_local_size(0);
        scratch[l] = x[get_global_id(0)];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = n / 2; s > 0; s >>= 1) {
            if (l < s) scratch[l] += scratch[l + s];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (l == 0) out[g] = scratch[0];
    }
    """
    mod = backend.load(src)
    x = torch.rand(4, 32)
    out = torch.empty(4)
    mod.block_sum(x, out, runtime.LocalMemory(32 * 4), grid=(4,), block=(32,))
    backend.synchronize()
    assert torch.allclose(out, x.sum(dim=1), rtol=1e-5)


def test_copy_path_matches_zero_copy() -> None:
    """The copy-in/copy-out path (other OpenCL runtimes) gives the same results as zero-copy."""
    b = OpenCLBackend(OpenCLOptions(zero_copy=False))
    b.select_device(0)
    mod = b.load(ADD, defines={"FACTOR": 1})
    base = torch.rand(300)
    a, c = base[3:103], torch.full((100,), float("nan"))
    mod.add(a, a, c, 100, grid=(2,), block=(64,))
    b.synchronize()
    assert torch.equal(c, a + a)


def test_compile_error_carries_log(backend: OpenCLBackend) -> None:
    with pytest.raises(CompileFailed, match=r"line 1:\d+") as info:
        backend.load("__kernel void broken( { }")
    assert "error" in info.value.log
    with pytest.raises(CompileFailed, match="no __kernel"):
        backend.load("int helper(int x) { return x; }")


def test_launch_errors(backend: OpenCLBackend) -> None:
    mod = backend.load(ADD, defines={"FACTOR": 1})
    a = torch.rand(64)
    too_big = (backend.require_device().max_work_group_size or 4096) * 2
    with pytest.raises(LaunchError, match="exceeds"):
        mod.add(a, a, a, 64, grid=(1,), block=(too_big,))
    with pytest.raises(LaunchError, match="not contiguous"):
        mod.add(a[::2], a[::2], a[::2], 32, grid=(1,), block=(32,))
    with pytest.raises(LaunchError, match="unsupported type"):
        mod.add(a, a, a, "64", grid=(1,), block=(64,))
    with pytest.raises(LaunchError, match="different dimensions"):
        mod.add(a, a, a, 64, grid=(1, 1), block=(64,))
    with pytest.raises(AttributeError, match="no kernel named 'sub'"):
        mod.sub  # noqa: B018


def test_platform_filter_without_match() -> None:
    b = OpenCLBackend(OpenCLOptions(platform="no-such-platform"))
    assert not b.capabilities().can_run and b.devices() == []
    with pytest.raises(BackendUnavailable, match="no device found"):
        b.select_device(None)


def test_runtime_load_uses_active_backend(backend: OpenCLBackend) -> None:
    runtime.set_backend(backend)
    try:
        mod = runtime.load(ADD, defines={"FACTOR": 1})
        a = torch.rand(10)
        c = torch.empty(10)
        mod.add(a, a, c, 10, grid=(runtime.cdiv(10, 4),), block=(4,))
        runtime.synchronize()
        assert torch.equal(c, a + a)
    finally:
        runtime.set_backend(None)
