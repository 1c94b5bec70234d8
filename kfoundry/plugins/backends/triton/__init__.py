"""The Triton backend: ``@triton.jit`` kernels launched from a KernelBench ``ModelNew``.

It registers everything a new language needs through the same hooks a third party would use: the
backend (``kf_register_backends``), the ``triton`` language (``kf_register_languages``: ``.py`` candidates,
its prompt template) and its behaviour descriptors (``kf_register_descriptors``). Without a GPU it runs
candidates in Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors): correctness only, its times
are not representative (the device's name and the toolchain say so in every record). With a GPU the
kernels are compiled. Nothing heavy is imported here: ``triton`` and torch load when a backend is used.
"""

from __future__ import annotations

from typing import Any

from kfoundry import hookimpl
from kfoundry.core.plugins import NoOptions
from kfoundry.plugins.backends.triton.backend import TritonBackend
from kfoundry.plugins.backends.triton.language import TRITON
from kfoundry.plugins.backends.triton.options import TritonOptions


def _descriptors(_options: NoOptions) -> Any:
    from kfoundry.plugins.backends.triton.descriptors import triton_descriptors

    return triton_descriptors()


@hookimpl
def kf_register_backends(register: Any) -> None:
    register(
        "triton",
        TritonBackend,  # the class: its `language` names a plain .py candidate's language in kf-run eval
        options=TritonOptions,
        description="Triton @triton.jit kernels (compiled on a GPU, else Triton's interpreter on the CPU)",
    )


@hookimpl
def kf_register_languages(register: Any) -> None:
    register(TRITON.name, TRITON)


@hookimpl
def kf_register_descriptors(register: Any) -> None:
    register(
        "triton",
        _descriptors,
        options=NoOptions,
        description="behaviour descriptors of Triton: static patterns (tl.dot, masked tl.load, block pointers, ...)",
    )
