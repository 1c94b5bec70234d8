"""What the backends that launch through a host-side queue (OpenCL, SYCL) share.

- :class:`LaunchError`, the error of a malformed launch;
- :func:`launch_dims`, the check of a ``grid`` or ``block`` argument;
- :class:`KernelLauncher`, the ``module.name(*args, grid=..., block=..., shared_mem=0)`` callable;
- :func:`device_profile`, a :class:`DeviceProfile` from what a runtime reports about a device;
- :class:`QueueBackend`, a backend with one lazily opened context on the selected device, the
  zero-copy choice and the launches kept alive until :meth:`Backend.synchronize`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from kfoundry.core.backend import Backend, BackendOptions
from kfoundry.core.errors import KfError
from kfoundry.core.models import DeviceProfile

#: Launches queued before the backend waits for them (and drops the buffers they keep alive).
MAX_PENDING = 256

Dims = int | Sequence[int]
C = TypeVar("C")


class LaunchError(KfError):
    """A kernel launch was malformed (wrong argument count or type, work-group size over the limit...)."""


def launch_dims(value: Dims | None, what: str) -> tuple[int, ...] | None:
    """``value`` (one size or 1-3 sizes) as a tuple of positive sizes; None stays None."""
    if value is None:
        return None
    try:
        dims = tuple(int(v) for v in value) if isinstance(value, Iterable) else (int(value),)
    except (TypeError, ValueError):
        raise LaunchError(f"{what} must be 1-3 positive sizes, got {value!r}") from None
    if not 1 <= len(dims) <= 3 or any(d <= 0 for d in dims):
        raise LaunchError(f"{what} must be 1-3 positive sizes, got {value!r}")
    return dims


LaunchFn = Callable[[Sequence[Any], Dims, Dims | None], None]


class KernelLauncher:
    """``module.name(*args, grid=..., block=..., shared_mem=0)`` for one kernel.

    ``launch(args, grid, block)`` does the work (a backend method with the kernel bound);
    ``no_shared_mem``, when set, is the error for a non-zero ``shared_mem`` (a backend whose
    dynamic local memory is an argument); else ``shared_mem`` is ignored.
    """

    def __init__(
        self, name: str, launch: LaunchFn, *, signature: Any = None, no_shared_mem: str = ""
    ) -> None:
        self.__name__ = name
        self._launch, self._signature, self._no_shared_mem = launch, signature, no_shared_mem

    @property
    def signature(self) -> Any:
        """The kernel's parsed signature, where the backend parses one (None otherwise)."""
        return self._signature

    def __call__(self, *args: Any, grid: Dims, block: Dims | None = None, shared_mem: int = 0) -> None:
        if shared_mem and self._no_shared_mem:
            raise LaunchError(self._no_shared_mem)
        self._launch(args, grid, block)


def device_profile(
    backend: str, index: int, info: Mapping[str, Any], *, driver_version: str, extra: dict[str, Any]
) -> DeviceProfile:
    """A :class:`DeviceProfile` from a runtime's device report, keyed by the profile's field names."""
    return DeviceProfile(
        backend=backend,
        name=str(info["name"]).strip(),
        index=index,
        vendor=str(info.get("vendor", "")).strip(),
        device_type=info.get("device_type", "other"),
        driver_version=driver_version,
        compute_units=info.get("compute_units"),
        max_work_group_size=info.get("max_work_group_size"),
        max_work_item_sizes=list(info.get("max_work_item_sizes") or []) or None,
        local_mem_bytes=info.get("local_mem_bytes"),
        global_mem_bytes=info.get("global_mem_bytes"),
        sub_group_sizes=info.get("sub_group_sizes") or None,
        preferred_vector_width_float=info.get("preferred_vector_width_float"),
        clock_mhz=float(info.get("clock_mhz") or 0) or None,
        l2_cache_bytes=info.get("l2_cache_bytes"),
        extra=extra,
    )


class QueueBackend(Backend, Generic[C]):
    """A backend with one context of type ``C`` on the selected device, opened on first use.

    Subclasses implement :meth:`_open` (and :meth:`_close` when a context must be released) and
    :meth:`_zero_copy_default`; their options may have a ``zero_copy: bool | None`` field.
    """

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        self._ctx: C | None = None
        self._pending: list[Any] = []

    @abstractmethod
    def _open(self) -> C:
        """Open a context (and queue) on the selected device; raise ``BackendUnavailable`` if it cannot."""

    def _close(self) -> None:
        """Forget the context (a subclass that must release it waits for its work first)."""
        self._ctx = None

    def _context(self) -> C:
        if self._ctx is None:
            self._ctx = self._open()
        return self._ctx

    def select_device(self, spec: str | int | None = None) -> DeviceProfile:
        self._close()
        return super().select_device(spec)

    @abstractmethod
    def _zero_copy_default(self) -> bool:
        """Whether tensor memory can be handed to kernels as is on the selected device."""

    def _zero_copy(self) -> bool:
        """Pass tensor memory as is: as the ``zero_copy`` option says, else the device's default."""
        forced: bool | None = getattr(self.options, "zero_copy", None)
        return self._zero_copy_default() if forced is None else forced

    def _keep(self, launch: Any) -> None:
        """Keep what a queued launch uses alive until :meth:`synchronize` (which runs past a limit)."""
        self._pending.append(launch)
        if len(self._pending) > MAX_PENDING:
            self.synchronize()
