"""The NVIDIA hardware plugin: registration, and its answer on a machine without a GPU."""

from __future__ import annotations

from kfoundry.core.hardware import HardwareDetector, detect_devices
from kfoundry.plugins.backends.cuda_launch import driver_device_count
from kfoundry.plugins.hardware.nvidia import NvidiaDetector


def test_registered_as_hardware_plugin(kf_plugin_manager) -> None:  # type: ignore[no-untyped-def]
    detector = kf_plugin_manager.get("hardware", "nvidia").build()
    assert isinstance(detector, HardwareDetector)
    assert detector.backends == ("cuda",)
    assert detector.detect("opencl") == []


def test_detection_agrees_with_the_driver(kf_plugin_manager) -> None:  # type: ignore[no-untyped-def]
    count, why = driver_device_count()
    detector = NvidiaDetector()
    profiles = detector.detect("cuda")
    if count == 0:
        assert profiles == [] or profiles[0].extra.get("source") == "torch"
        assert detector.unavailable_reason() == why != ""
    else:
        assert len(profiles) == count
        assert all(p.vendor == "NVIDIA" and p.compute_capability for p in profiles)
    assert len(detect_devices("cuda")) == len(profiles)
