"""The hardware plugin contract: detectors that describe a backend's devices as ``DeviceProfile``s.

A hardware plugin registers a factory returning a :class:`HardwareDetector` through
``kf_register_hardware``. Backends ask :func:`detect_devices` for the profiles of the devices they
drive; peak rates (table or measured, :mod:`kfoundry.core.peaks`) are filled in there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from kfoundry.core.models import DeviceProfile
from kfoundry.core.plugins import PluginManager, get_plugin_manager


class HardwareDetector(ABC):
    """Finds devices of one vendor or API and describes each one."""

    #: Backends whose devices this detector describes (e.g. ``("cuda",)``).
    backends: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def detect(self, backend: str) -> list[DeviceProfile]:
        """Profiles of every device visible for ``backend`` (empty when none or not applicable)."""

    def unavailable_reason(self) -> str:
        """Why no device was found (empty when devices were found or the reason is unknown)."""
        return ""


def detect_devices(backend: str, manager: PluginManager | None = None) -> list[DeviceProfile]:
    """Every device any registered hardware plugin finds for ``backend``, with peak rates filled in."""
    from kfoundry.core.peaks import with_peaks

    found: list[DeviceProfile] = []
    for spec in (manager or get_plugin_manager()).registry("hardware"):
        detector = spec.build()
        if backend in getattr(detector, "backends", ()):
            found.extend(with_peaks(p) for p in detector.detect(backend))
    return found
