"""The offline generator plugin (no language model) and the OpenCL/CUDA/SYCL behaviour descriptors.

Registers the ``offline`` generator (``kf_register_llms``) and the static descriptor extractors
for the ``opencl``, ``cuda`` and ``sycl`` languages (``kf_register_descriptors``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kfoundry import hookimpl
from kfoundry.core.descriptors import cuda_descriptors, opencl_descriptors
from kfoundry.core.hookspecs import Register
from kfoundry.core.plugins import NoOptions
from kfoundry.plugins.llms.offline.options import OfflineOptions
from kfoundry.plugins.llms.offline.sycl_descriptors import sycl_descriptors

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator

__all__ = ["OfflineGenerator", "OfflineOptions"]


def __getattr__(name: str) -> Any:
    """``OfflineGenerator`` on first use: it traces problems with torch.fx, so it imports torch."""
    if name == "OfflineGenerator":
        from kfoundry.plugins.llms.offline.generator import OfflineGenerator

        return OfflineGenerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _offline(options: OfflineOptions | None = None) -> OfflineGenerator:
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator

    return OfflineGenerator(options)


@hookimpl
def kf_register_llms(register: Register) -> None:
    register("offline", _offline, options=OfflineOptions,
             description="cookbook kernels for recognised operation families (no language model)")


@hookimpl
def kf_register_descriptors(register: Register) -> None:
    register("opencl", lambda _opts: opencl_descriptors(), options=NoOptions,
             description="static OpenCL C behaviour descriptors (memory, compute, parallelism)")
    register("cuda", lambda _opts: cuda_descriptors(), options=NoOptions,
             description="static CUDA behaviour descriptors (memory, compute, parallelism)")
    register("sycl", lambda _opts: sycl_descriptors(), options=NoOptions,
             description="static SYCL behaviour descriptors (memory, compute, parallelism)")
