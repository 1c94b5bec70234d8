"""The offline generator plugin (no language model) and the OpenCL/CUDA behaviour descriptors.

Registers the ``offline`` generator (``kf_register_llms``) and the static descriptor extractors
for the ``opencl`` and ``cuda`` languages (``kf_register_descriptors``).
"""

from __future__ import annotations

from kfoundry import hookimpl
from kfoundry.core.descriptors import cuda_descriptors, opencl_descriptors
from kfoundry.core.hookspecs import Register
from kfoundry.core.plugins import NoOptions
from kfoundry.plugins.llms.offline.generator import OfflineGenerator, OfflineOptions

__all__ = ["OfflineGenerator", "OfflineOptions"]


@hookimpl
def kf_register_llms(register: Register) -> None:
    register("offline", OfflineGenerator, options=OfflineOptions,
             description="cookbook kernels for recognised operation families (no language model)")


@hookimpl
def kf_register_descriptors(register: Register) -> None:
    register("opencl", lambda _opts: opencl_descriptors(), options=NoOptions,
             description="static OpenCL C behaviour descriptors (memory, compute, parallelism)")
    register("cuda", lambda _opts: cuda_descriptors(), options=NoOptions,
             description="static CUDA behaviour descriptors (memory, compute, parallelism)")
