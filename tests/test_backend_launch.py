"""The launch helpers OpenCL and SYCL share (kfoundry/plugins/backends/launch.py), on real PoCL kernels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from kfoundry.plugins.backends import launch, opencl, sycl
from kfoundry.plugins.backends.launch import KernelLauncher, LaunchError, launch_dims

SCALE = """
__kernel void scale(__global float* x, float a, int n) {
    int i = get_global_id(0);
    if (i < n) x[i] *= a;
}
"""


def test_one_launch_error_for_both_backends() -> None:
    assert opencl.LaunchError is sycl.LaunchError is launch.LaunchError


@pytest.mark.parametrize(
    ("value", "dims"),
    [
        (4, (4,)),
        (np.int64(4), (4,)),
        ((2, 3), (2, 3)),
        ([1, 2, 3], (1, 2, 3)),
        (np.array([8, 2]), (8, 2)),
        (None, None),
    ],
)
def test_launch_dims_accepts_sizes(value: Any, dims: tuple[int, ...] | None) -> None:
    assert launch_dims(value, "grid") == dims


@pytest.mark.parametrize("value", [0, -1, (1, 2, 3, 4), (), (2, 0), "xy", object()])
def test_launch_dims_refuses_others_in_one_line(value: Any) -> None:
    with pytest.raises(LaunchError, match=r"^block must be 1-3 positive sizes, got "):
        launch_dims(value, "block")


def test_kernel_launcher_hands_the_launch_over_or_refuses_shared_mem() -> None:
    calls: list[tuple[Any, ...]] = []
    plain = KernelLauncher("k", lambda args, grid, block: calls.append((args, grid, block)))
    plain(1, 2, grid=(4,), block=2, shared_mem=64)  # ignored where the backend takes no dynamic local memory
    assert calls == [((1, 2), (4,), 2)] and plain.__name__ == "k" and plain.signature is None
    strict = KernelLauncher(
        "k", lambda *a: calls.append(a), signature="sig", no_shared_mem="no shared_mem here"
    )
    with pytest.raises(LaunchError, match="no shared_mem here"):
        strict(grid=1, shared_mem=16)
    assert strict.signature == "sig" and len(calls) == 1


def test_queue_backend_opens_one_context_and_drops_it_on_a_new_device() -> None:
    backend = opencl.OpenCLBackend()
    if not backend.capabilities().can_run:
        pytest.skip("no OpenCL device")
    module = backend.load(SCALE)
    x = torch.ones(1000)
    for _ in range(launch.MAX_PENDING + 5):  # past the limit the backend waits and lets go of the buffers
        module.scale(x, 1.0, 1000, grid=(16,), block=(64,))
    assert len(backend._pending) < launch.MAX_PENDING
    first = backend._context()
    assert backend._context() is first
    module.scale(x, 2.0, 1000, grid=(16,), block=(64,))
    backend.synchronize()
    assert torch.equal(x, torch.full((1000,), 2.0)) and not backend._pending
    backend.select_device(0)
    assert backend._ctx is None and backend._context() is not first


def test_zero_copy_follows_the_option_else_the_device() -> None:
    backend = opencl.OpenCLBackend(opencl.OpenCLOptions(zero_copy=False))
    if not backend.capabilities().can_run:
        pytest.skip("no OpenCL device")
    assert backend._zero_copy() is False
    default = opencl.OpenCLBackend()
    assert default._zero_copy() is default._zero_copy_default()
