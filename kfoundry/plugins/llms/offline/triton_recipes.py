"""Triton recipes for the offline generator: the recipe type and the family dispatch.

A :class:`TritonRecipe` renders a ``ModelNew`` whose kernels are ``@triton.jit`` functions launched as
``kernel[grid](...)``; template parameters are ``tl.constexpr`` block sizes and the ``num_warps``
launch option. The elementwise ladder is in :mod:`.triton_elementwise`, the matrix products in
:mod:`.triton_matmul`, the row ladder (softmax, log-softmax, layer/RMS norm, reductions) in
:mod:`.triton_rows`.
"""

from __future__ import annotations

import textwrap

from kfoundry.core.generator import GeneratorUnsupported
from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec

ROW_FAMILIES = ("softmax", "log_softmax", "layer_norm", "rms_norm", "reduce")
WARPS = [1, 2, 4, 8]


class TritonRecipe(Recipe):
    """A recipe whose ``kernel`` is Python: ``@triton.jit`` functions at module level."""

    def render(self) -> str:
        init = "".join(f"        self.m{i} = {ctor}\n" for i, ctor in enumerate(self.modules))
        body = textwrap.indent(textwrap.dedent(self.forward).strip("\n"), " " * 8)
        return f'''"""kfoundry offline cookbook: {self.name} (triton). {self.description}"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

# PARAMS (template parameter values) is injected by the kfoundry harness
DEFAULTS = {dict(self.defaults)!r}


{self.kernel.strip()}


def _prod(dims):
    out = 1
    for d in dims:
        out *= d
    return out


class ModelNew(nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()
{init}
    def forward(self, {", ".join(self.forward_args)}):
        p = {{**DEFAULTS, **PARAMS}}
{body}
'''


def make_recipe(
    name: str,
    family: str,
    kernel: str,
    forward: str,
    args: list[str],
    space: TunableSpace,
    defaults: dict[str, int],
    rank: int,
    description: str,
    modules: list[str] | None = None,
) -> Recipe:
    return TritonRecipe(
        name,
        family,
        "triton",
        kernel,
        forward,
        args,
        space,
        dict(defaults),
        rank=rank,
        modules=list(modules or []),
        description=description,
    )


def recipes(spec: OpSpec) -> list[Recipe]:
    """The Triton recipes for ``spec`` (GeneratorUnsupported outside the elementwise and row families)."""
    from kfoundry.plugins.llms.offline.index_width import adapt

    if spec.family == "elementwise":
        from kfoundry.plugins.llms.offline.triton_elementwise import elementwise_recipes

        return adapt(elementwise_recipes(spec), spec)
    if spec.family == "matmul":
        from kfoundry.plugins.llms.offline.triton_matmul import matmul_recipes

        return adapt(matmul_recipes(spec), spec)
    if spec.family in ROW_FAMILIES:
        from kfoundry.plugins.llms.offline.triton_rows import row_recipes

        return adapt(row_recipes(spec), spec)
    raise GeneratorUnsupported(
        f"offline generator: no Triton recipes for the {spec.family} family (elementwise, matmul and row families only)"
    )
