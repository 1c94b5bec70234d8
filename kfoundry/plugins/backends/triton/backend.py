"""The Triton backend object: devices, toolchain, launch counting and the interpreter switch.

A Triton candidate defines its kernels with ``@triton.jit`` and launches them from ``forward`` as
``kernel[grid](...)``; nothing goes through :func:`kfoundry.runtime.load`, so this backend counts
launches itself (:attr:`TritonBackend.launch_count`, read by the runner's "launched no kernel" check).
"""

from __future__ import annotations

import contextlib
import os
from importlib import metadata
from typing import Any, ClassVar

from kfoundry.core.backend import Backend, BackendCapabilities, CompileFailed, KernelModule
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.models import DeviceProfile, ParamValue
from kfoundry.plugins.backends.triton.options import TritonOptions

#: Name of the interpreter "device": it says that its times are not representative.
INTERPRETER_DEVICE = "Triton interpreter (CPU; times not representative)"


def triton_version() -> str | None:
    """The installed Triton's version, without importing it (None: not installed)."""
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def _gpu_count() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _interpreted_library() -> bool:
    """Whether Triton's own ``@jit`` library functions (``tl.max``, ``tl.sum``...) are interpreted ones:
    they are decorated once, when ``triton.language`` is first imported."""
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(getattr(standard, "max", None), InterpretedFunction)


class _LaunchCounter:
    """Counts Triton kernel launches in this process (interpreted and compiled)."""

    count = 0
    installed: ClassVar[set[str]] = set()

    @classmethod
    def install(cls, interpret: bool) -> None:
        mode = "interpret" if interpret else "compile"
        if mode in cls.installed:
            return
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction

            original = InterpretedFunction.run

            def run(self: Any, *args: Any, **kwargs: Any) -> Any:
                if not kwargs.get("warmup"):
                    cls.count += 1
                return original(self, *args, **kwargs)

            InterpretedFunction.run = run
        else:
            from triton import knobs

            def entered(*_args: Any, **_kwargs: Any) -> None:
                cls.count += 1

            knobs.runtime.launch_enter_hook.add(entered)
        cls.installed.add(mode)


def _follow_home() -> None:
    """Point Triton's cache, dump and override folders at the current ``$HOME``.

    A sandboxed runner's ``$HOME`` is its scratch folder, but Triton read its home when the fork server
    imported it (``/root``, read-only in the sandbox): every compiled candidate failed on the H200 with
    ``OSError: Read-only file system: '/root'``.
    """
    home = os.environ.get("HOME")
    if not home:
        return
    os.environ["TRITON_HOME"] = home
    import triton

    cache = getattr(getattr(triton, "knobs", None), "cache", None)
    if cache is not None:
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            cache.home_dir = home


class TritonBackend(Backend):
    """``@triton.jit`` kernels: compiled on a GPU, or run by Triton's interpreter on CPU tensors."""

    name = "triton"
    language = "triton"

    def __init__(self, options: TritonOptions | None = None) -> None:
        super().__init__(options or TritonOptions())
        self.options: TritonOptions
        self.interpret = self._interpret()
        self.torch_device = "cpu" if self.interpret else "cuda"
        if self.interpret:  # read by @triton.jit when a candidate's module runs
            os.environ["TRITON_INTERPRET"] = "1"
        else:
            os.environ.pop("TRITON_INTERPRET", None)
            _follow_home()

    def _interpret(self) -> bool:
        mode = self.options.mode
        if mode == "auto":
            return os.environ.get("TRITON_INTERPRET", "") == "1" or _gpu_count() == 0
        return mode == "interpret"

    # -- what this machine can do ---------------------------------------------------------------

    def capabilities(self) -> BackendCapabilities:
        if triton_version() is None:
            return BackendCapabilities(
                can_compile=False,
                can_run=False,
                reason="triton is not installed (pip install 'kfoundry[triton]')",
            )
        if self.interpret:
            return BackendCapabilities(
                can_compile=True,
                can_run=True,
                reason="Triton interpreter: correctness only, times not representative",
            )
        if _gpu_count() == 0:
            return BackendCapabilities(can_compile=False, can_run=False, reason="mode 'compile' needs a GPU")
        return BackendCapabilities(can_compile=True, can_run=True)

    def devices(self) -> list[DeviceProfile]:
        if triton_version() is None:
            return []
        if self.interpret:
            return [
                DeviceProfile(
                    backend=self.name,
                    name=INTERPRETER_DEVICE,
                    vendor="triton",
                    device_type="cpu",
                    compute_units=os.cpu_count(),
                    extra={"interpreter": True, "times_representative": False},
                )
            ]
        from kfoundry.core.hardware import detect_devices

        found = detect_devices("cuda") or self._torch_devices()
        return [
            d.model_copy(update={"backend": self.name, "extra": {**d.extra, "interpreter": False}})
            for d in found
        ]

    def _torch_devices(self) -> list[DeviceProfile]:
        import torch

        out = []
        for i in range(_gpu_count()):
            props = torch.cuda.get_device_properties(i)
            out.append(
                DeviceProfile(
                    backend=self.name,
                    name=props.name,
                    index=i,
                    device_type="gpu",
                    compute_units=props.multi_processor_count,
                    global_mem_bytes=props.total_memory,
                    compute_capability=f"{props.major}.{props.minor}",
                )
            )
        return out

    def select_device(self, spec: str | int | None = None) -> DeviceProfile:
        chosen = super().select_device(spec)
        if not self.interpret:
            self.torch_device = f"cuda:{chosen.index}"
            if chosen.index != 0:  # Triton launches on the current device
                import torch

                torch.cuda.set_device(chosen.index)
        elif not _interpreted_library():
            raise BackendUnavailable(
                "backend triton: triton was imported before TRITON_INTERPRET=1 was set, so its library "
                "functions are compiled ones; set TRITON_INTERPRET=1 in the environment"
            )
        _LaunchCounter.install(self.interpret)
        return chosen

    def toolchain_version(self) -> str:
        version = triton_version() or "not installed"
        if self.interpret:
            return f"triton {version} interpreter (times not representative)"
        import torch

        return f"triton {version}, torch {torch.__version__}, cuda {torch.version.cuda or torch.version.hip}"

    # -- compiling and running ------------------------------------------------------------------

    @property
    def launch_count(self) -> int:
        """Triton kernel launches so far in this process (``kernel[grid](...)`` calls)."""
        return _LaunchCounter.count

    def load(
        self,
        source: str,
        *,
        defines: dict[str, ParamValue] | None = None,
        build_options: list[str] | None = None,
    ) -> KernelModule:
        raise CompileFailed(
            "the triton backend compiles no kernel source: define kernels with @triton.jit in the ModelNew "
            "module and launch them as kernel[grid](...)"
        )

    def synchronize(self) -> None:
        if self.interpret:
            return
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailable("backend triton: PyTorch sees no GPU")
        torch.cuda.synchronize()
