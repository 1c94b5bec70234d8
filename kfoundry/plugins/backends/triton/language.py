"""The ``triton`` kernel language: ModelNew ``.py`` candidates whose kernels are ``@triton.jit`` functions."""

from __future__ import annotations

from importlib import resources

from kfoundry.core.languages import LanguageSpec

TRITON = LanguageSpec(
    name="triton",
    suffixes=(".py",),
    fences=("triton",),  # replies are ModelNew modules (found by `class ModelNew`), not bare kernels
    candidate_kind="python",
    prompt_template=resources.files(__package__).joinpath("prompt.j2").read_text(encoding="utf-8"),
    description="Triton (@triton.jit kernels launched from a KernelBench ModelNew)",
    allowed_imports=("triton", "triton.language"),
)
