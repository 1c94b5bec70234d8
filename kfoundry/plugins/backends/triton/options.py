"""Options of the Triton backend (a light module: the plugin's entry point imports it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kfoundry.core.backend import BackendOptions


class TritonOptions(BackendOptions):
    """``backend.options`` of ``backend.name = "triton"``."""

    mode: Literal["auto", "interpret", "compile"] = Field(
        "auto",
        description=(
            "auto: compiled where PyTorch sees a GPU, else Triton's interpreter; interpret: always the "
            "interpreter (TRITON_INTERPRET=1, CPU tensors; correctness only, times not representative); "
            "compile: always compiled (needs a GPU)"
        ),
    )
