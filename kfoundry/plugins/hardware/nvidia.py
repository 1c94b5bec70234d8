"""NVIDIA hardware plugin: a ``DeviceProfile`` for every CUDA device, read from the driver.

Name, compute capability, SMs, warp size, shared memory per block (default and opt-in) and per SM,
registers, L2, clocks, memory size and bus width come from ``cuDeviceGetAttribute`` (through
``cuda-python``); where that is missing, from PyTorch's device properties.
"""

from __future__ import annotations

from typing import Any

from kfoundry import hookimpl
from kfoundry.core.hardware import HardwareDetector
from kfoundry.core.hookspecs import Register
from kfoundry.core.models import DeviceProfile


class NvidiaDetector(HardwareDetector):
    """Describes CUDA devices for the ``cuda`` backend."""

    backends = ("cuda",)

    def __init__(self) -> None:
        self._reason = ""

    def detect(self, backend: str = "cuda") -> list[DeviceProfile]:
        from kfoundry.plugins.backends.cuda_launch import driver_device_count

        if backend not in self.backends:
            return []
        count, self._reason = driver_device_count()
        if count:
            return [driver_profile(i) for i in range(count)]
        return torch_profiles()

    def unavailable_reason(self) -> str:
        return self._reason


def _attr(drv: Any, device: Any, name: str) -> int | None:
    attr = getattr(drv.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}", None)
    if attr is None:
        return None
    code, value = drv.cuDeviceGetAttribute(attr, device)
    return int(value) if int(code) == 0 else None


def _mhz(khz: int | None) -> float | None:
    return khz / 1000.0 if khz else None


def driver_profile(index: int) -> DeviceProfile:
    """The profile of CUDA device ``index`` from the driver's attributes."""
    from cuda.bindings import driver as drv

    from kfoundry.plugins.backends.cuda_launch import check

    device = check(drv.cuDeviceGet(index), "cuDeviceGet")
    raw_name = check(drv.cuDeviceGetName(256, device), "cuDeviceGetName")
    name = (raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)).split("\x00")[0].strip()
    major = _attr(drv, device, "COMPUTE_CAPABILITY_MAJOR")
    minor = _attr(drv, device, "COMPUTE_CAPABILITY_MINOR")
    version = int(check(drv.cuDriverGetVersion(), "cuDriverGetVersion"))
    total = int(check(drv.cuDeviceTotalMem(device), "cuDeviceTotalMem"))
    mem_clock = _attr(drv, device, "MEMORY_CLOCK_RATE")
    bus_width = _attr(drv, device, "GLOBAL_MEMORY_BUS_WIDTH")
    extra: dict[str, Any] = {
        "memory_bus_width_bits": bus_width,
        "max_threads_per_sm": _attr(drv, device, "MAX_THREADS_PER_MULTIPROCESSOR"),
        "max_blocks_per_sm": _attr(drv, device, "MAX_BLOCKS_PER_MULTIPROCESSOR"),
        "shared_mem_per_block_default": _attr(drv, device, "MAX_SHARED_MEMORY_PER_BLOCK"),
        "max_grid": [_attr(drv, device, f"MAX_GRID_DIM_{a}") for a in "XYZ"],
        "pci_bus_id": _attr(drv, device, "PCI_BUS_ID"),
    }
    if mem_clock and bus_width:  # double data rate: two transfers per memory clock
        extra["theoretical_bandwidth_gbs"] = round(2 * mem_clock * 1e3 * bus_width / 8 / 1e9, 1)
    return DeviceProfile(
        backend="cuda",
        name=name,
        index=index,
        vendor="NVIDIA",
        device_type="gpu",
        driver_version=f"{version // 1000}.{(version % 1000) // 10}",
        compute_units=_attr(drv, device, "MULTIPROCESSOR_COUNT"),
        max_work_group_size=_attr(drv, device, "MAX_THREADS_PER_BLOCK"),
        max_work_item_sizes=[_attr(drv, device, f"MAX_BLOCK_DIM_{a}") or 0 for a in "XYZ"],
        local_mem_bytes=_attr(drv, device, "MAX_SHARED_MEMORY_PER_BLOCK"),
        global_mem_bytes=total,
        warp_size=_attr(drv, device, "WARP_SIZE"),
        sub_group_sizes=[32],
        compute_capability=f"{major}.{minor}" if major is not None else None,
        shared_mem_per_block=_attr(drv, device, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        shared_mem_per_sm=_attr(drv, device, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        registers_per_block=_attr(drv, device, "MAX_REGISTERS_PER_BLOCK"),
        registers_per_sm=_attr(drv, device, "MAX_REGISTERS_PER_MULTIPROCESSOR"),
        l2_cache_bytes=_attr(drv, device, "L2_CACHE_SIZE"),
        clock_mhz=_mhz(_attr(drv, device, "CLOCK_RATE")),
        memory_clock_mhz=_mhz(mem_clock),
        extra=extra,
    )


def torch_profiles() -> list[DeviceProfile]:
    """Profiles from PyTorch's device properties (when cuda-python is missing but PyTorch sees GPUs)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        count = torch.cuda.device_count()
    except Exception:  # a broken CUDA install must not take `kf-run devices` down
        return []
    profiles = []
    for index in range(count):
        p = torch.cuda.get_device_properties(index)
        profiles.append(
            DeviceProfile(
                backend="cuda",
                name=p.name,
                index=index,
                vendor="NVIDIA",
                device_type="gpu",
                compute_units=p.multi_processor_count,
                global_mem_bytes=p.total_memory,
                warp_size=getattr(p, "warp_size", 32),
                compute_capability=f"{p.major}.{p.minor}",
                shared_mem_per_block=getattr(p, "shared_memory_per_block_optin", None),
                shared_mem_per_sm=getattr(p, "shared_memory_per_multiprocessor", None),
                registers_per_sm=getattr(p, "regs_per_multiprocessor", None),
                l2_cache_bytes=getattr(p, "L2_cache_size", None),
                extra={"source": "torch"},
            )
        )
    return profiles


@hookimpl
def kf_register_hardware(register: Register) -> None:
    register("nvidia", lambda options: NvidiaDetector(), description="NVIDIA GPUs through the CUDA driver")
