"""Registering a language's behaviour descriptors: static patterns plus the measurer, if any.

Each bundled backend registers its language's extractor from its own ``kf_register_descriptors``
hook with :func:`register_descriptors`, so descriptors follow the backend that runs the language,
not any generator (``KF_DISABLE_PLUGINS=offline`` leaves them intact).
"""

from __future__ import annotations

from collections.abc import Callable

from kfoundry.core.behaviour.measure import measure_cuda, measure_hip, measure_opencl
from kfoundry.core.behaviour.measure_sycl import measure_sycl
from kfoundry.core.descriptors import (
    PatternDescriptors,
    cuda_descriptors,
    hip_descriptors,
    opencl_descriptors,
)
from kfoundry.core.descriptors_sycl import sycl_descriptors
from kfoundry.core.hookspecs import Register
from kfoundry.core.plugins import NoOptions

_BUILDERS: dict[str, tuple[Callable[[], PatternDescriptors], str]] = {
    "opencl": (
        lambda: opencl_descriptors(measure_opencl),
        "OpenCL C: static patterns; measured from clang's LLVM IR",
    ),
    "cuda": (
        lambda: cuda_descriptors(measure_cuda),
        "CUDA: static patterns; measured from SASS/PTX and ptxas",
    ),
    "hip": (
        lambda: hip_descriptors(measure_hip),
        "HIP: static patterns; measured from the AMDGPU code object",
    ),
    "sycl": (
        lambda: sycl_descriptors(measure_sycl),
        "SYCL: static patterns; measured from the runtime's SPIR-V and kernel info",
    ),
}


def extractor_for(language: str) -> PatternDescriptors:
    """The bundled extractor of ``language`` (one of opencl, cuda, hip, sycl)."""
    return _BUILDERS[language][0]()


def register_descriptors(register: Register, language: str) -> None:
    """Register the bundled extractor of ``language`` through a ``kf_register_descriptors`` hook."""
    build, description = _BUILDERS[language]
    register(
        language,
        lambda _opts: build(),
        options=NoOptions,
        description=f"behaviour descriptors of {description}",
    )
