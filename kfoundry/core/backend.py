"""The backend plugin contract: compile kernel source, launch it on torch tensors, describe devices.

A candidate's ``ModelNew`` reaches its backend through :mod:`kfoundry.runtime`
(``load(source, defines=PARAMS)``), which forwards to the active backend's :meth:`Backend.load`.
Launch convention, the same on every backend (CUDA's): ``module.kernel(*args, grid=(gx, gy, gz),
block=(bx, by, bz), shared_mem=0)``; on OpenCL the global size is ``grid * block`` element-wise
and the local size is ``block``. Tensor arguments are torch tensors on :attr:`Backend.torch_device`;
Python ints are passed as int32, floats as float32, numpy scalars keep their type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from kfoundry.core.errors import BackendUnavailable, KfError
from kfoundry.core.models import DeviceProfile, Language, ParamValue


class CompileFailed(KfError):
    """A kernel did not compile; ``log`` holds the compiler's output (feedback for the next prompt)."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class BackendCapabilities(BaseModel):
    """What a backend can do on this machine, and why not where it cannot."""

    model_config = ConfigDict(extra="forbid")

    can_compile: bool
    can_run: bool
    reason: str = ""


class KernelModule:
    """A compiled program: its kernels as attributes, each callable with ``grid=`` and ``block=``."""

    def __init__(
        self,
        kernels: dict[str, Callable[..., Any]],
        resources: dict[str, Any] | None = None,
        compile_time_s: float = 0.0,
        log: str = "",
    ) -> None:
        self._kernels = kernels
        #: Per-kernel resource report (registers, shared/local memory, spills), where the toolchain tells.
        self.resources: dict[str, Any] = resources or {}
        self.compile_time_s = compile_time_s
        self.log = log

    def __getattr__(self, name: str) -> Callable[..., Any]:
        try:
            return self.__dict__["_kernels"][name]
        except KeyError:
            known = ", ".join(sorted(self.__dict__.get("_kernels", {}))) or "none"
            raise AttributeError(
                f"no kernel named {name!r} in the compiled program (kernels: {known})"
            ) from None

    @property
    def kernel_names(self) -> list[str]:
        return sorted(self._kernels)


class BackendOptions(BaseModel):
    """Options shared by every backend (a backend may extend this model)."""

    model_config = ConfigDict(extra="forbid")

    build_options: list[str] = Field(default_factory=list, description="extra compiler flags")


class Backend(ABC):
    """A hardware backend. Subclasses set ``name`` and ``language`` and implement the abstract methods."""

    name: ClassVar[str]
    language: ClassVar[Language]
    #: torch device string where kernel arguments must live ("cpu" for OpenCL on PoCL, "cuda" ...).
    torch_device: str = "cpu"

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()
        self.device: DeviceProfile | None = None

    @abstractmethod
    def capabilities(self) -> BackendCapabilities:
        """Whether this machine can compile and run for this backend, with the reason if not."""

    @abstractmethod
    def devices(self) -> list[DeviceProfile]:
        """Every device this backend can see (empty if none)."""

    @abstractmethod
    def toolchain_version(self) -> str:
        """Compiler / runtime versions; part of every evaluation cache key."""

    @abstractmethod
    def load(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        """Compile ``source`` for the selected device; raise :class:`CompileFailed` with the log."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until all work queued on the selected device has finished."""

    def select_device(self, spec: str | int | None = None) -> DeviceProfile:
        """Pick a device by index or case-insensitive name substring (None: the first)."""
        found = self.devices()
        if not found:
            caps = self.capabilities()
            raise BackendUnavailable(
                f"backend {self.name}: no device found ({caps.reason or 'none visible'})"
            )
        if spec is None or spec == "":
            chosen = found[0]
        elif isinstance(spec, int) or str(spec).isdigit():
            idx = int(spec)
            if not 0 <= idx < len(found):
                raise BackendUnavailable(f"backend {self.name}: no device {idx} (have {len(found)})")
            chosen = found[idx]
        else:
            matches = [d for d in found if str(spec).lower() in d.name.lower()]
            if not matches:
                names = "; ".join(d.name for d in found)
                raise BackendUnavailable(f"backend {self.name}: no device matching {spec!r} (have: {names})")
            chosen = matches[0]
        self.device = chosen
        return chosen

    def device_timer(self) -> Callable[[Callable[[], object]], float] | None:
        """A device-side clock for one call, in ms (e.g. CUDA events), or None: the timer uses the host clock.

        It must wait for the call's work to finish before returning, on every queue the call may use.
        """
        return None

    def require_device(self) -> DeviceProfile:
        """The selected device, selecting the first one if none was chosen yet."""
        return self.device or self.select_device(None)
