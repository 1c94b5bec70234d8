"""CUDA backend on a real GPU: launches, argument packing, shared memory, faults (skipped without one)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kfoundry.plugins.backends.cuda_launch import driver_device_count

_COUNT, _WHY = driver_device_count()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_COUNT == 0, reason=f"no CUDA device: {_WHY}")]

KERNELS = r"""
extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
extern "C" __global__ void axpy64(double* y, const double* x, double alpha, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += alpha * x[i];
}
extern "C" __global__ void reverse_shared(float* x, int n) {
    extern __shared__ float tile[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = tile[n - 1 - i];
}
template <int K> __global__ void times(float* x) { x[threadIdx.x] *= K; }
template __global__ void times<3>(float*);
"""


@pytest.fixture(scope="module")
def module():  # type: ignore[no-untyped-def]
    from kfoundry.plugins.backends.cuda import CudaBackend

    backend = CudaBackend()
    backend.select_device(0)
    return backend, backend.load(KERNELS)


def test_add_matches_torch(module) -> None:  # type: ignore[no-untyped-def]
    import torch

    backend, mod = module
    n = 1_000_003
    a, b = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
    c = torch.full_like(a, float("nan"))
    mod.add(a, b, c, n, grid=((n + 255) // 256,), block=(256,))
    backend.synchronize()
    assert torch.equal(c, a + b)
    assert mod.resources["add"]["driver_registers"] > 0


def test_eight_byte_parameters_follow_the_kernel_layout(module) -> None:  # type: ignore[no-untyped-def]
    import torch

    backend, mod = module
    n = 4096
    x = torch.rand(n, device="cuda", dtype=torch.float64)
    y = torch.rand(n, device="cuda", dtype=torch.float64)
    expected = y + 0.1 * x
    mod.axpy64(y, x, 0.1, n, grid=(n // 128,), block=(128,))
    backend.synchronize()
    assert torch.allclose(y, expected, rtol=0, atol=1e-15)


def test_large_dynamic_shared_memory(module) -> None:  # type: ignore[no-untyped-def]
    import torch

    backend, mod = module
    n = 100 * 1024 // 4  # 100 KiB: above the 48 KiB default, needs the opt-in limit
    x = torch.rand(n, device="cuda")
    expected = x.flip(0)
    mod.reverse_shared(x, n, grid=1, block=256, shared_mem=n * 4)
    backend.synchronize()
    assert torch.equal(x, expected)


def test_template_instance_by_short_name(module) -> None:  # type: ignore[no-untyped-def]
    import torch

    backend, mod = module
    x = torch.ones(32, device="cuda")
    mod.times(x, grid=1, block=32)
    backend.synchronize()
    assert torch.equal(x, torch.full_like(x, 3.0))


def test_bad_launches_are_refused(module) -> None:  # type: ignore[no-untyped-def]
    import torch

    from kfoundry.plugins.backends.cuda_launch import CudaLaunchError

    _, mod = module
    a = torch.rand(8, device="cuda")
    with pytest.raises(CudaLaunchError, match="takes 4 arguments"):
        mod.add(a, a, grid=1, block=8)
    with pytest.raises(CudaLaunchError, match="cpu tensor"):
        mod.add(a.cpu(), a, a, 8, grid=1, block=8)
    with pytest.raises(CudaLaunchError):
        mod.add(a, a, a, 8, grid=1, block=4096)


def test_illegal_address_is_a_gpu_fault_in_its_own_process() -> None:
    script = textwrap.dedent(
        """
        import torch
        from kfoundry.plugins.backends.cuda import CudaBackend
        from kfoundry.plugins.backends.cuda_launch import GpuFault
        b = CudaBackend(); b.select_device(0)
        m = b.load('extern "C" __global__ void bad(float* p) { p[1ll << 40] = 1.0f; }')
        x = torch.zeros(1, device="cuda")
        m.bad(x, grid=1, block=1)
        try:
            b.synchronize()
        except GpuFault as exc:
            print("FAULT", exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "FAULT" in proc.stdout, proc.stdout + proc.stderr
    assert "illegal" in proc.stdout.lower()


def test_nvidia_profile_is_complete() -> None:
    from kfoundry.plugins.hardware.nvidia import NvidiaDetector

    profile = NvidiaDetector().detect("cuda")[0]
    assert profile.compute_capability and profile.compute_units and profile.compute_units > 0
    assert profile.warp_size == 32
    assert profile.shared_mem_per_block and profile.shared_mem_per_block >= 48 * 1024
    assert profile.l2_cache_bytes and profile.registers_per_sm and profile.global_mem_bytes


def test_device_timer_counts_the_kernel_and_work_hidden_on_another_stream(module) -> None:  # type: ignore[no-untyped-def]
    import torch

    from kfoundry.plugins.backends.cuda import SPIN_SOURCE

    backend, _ = module
    spin = backend.load(SPIN_SOURCE).kf_spin
    timer = backend.device_timer()
    assert timer is not None
    # Lower bounds only: a kernel that spins 2 ms cannot be timed shorter than that.
    assert timer(lambda: spin(2_000_000, grid=1, block=1)) >= 1.9
    side = torch.cuda.Stream()

    def hidden() -> None:
        with torch.cuda.stream(side):
            spin(20_000_000, grid=1, block=1)

    # The events on the current stream see nothing; the host-time guard must still count 20 ms.
    assert timer(hidden) >= 19.0
