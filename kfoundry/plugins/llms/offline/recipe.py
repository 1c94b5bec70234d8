"""A cookbook recipe: one optimisation step for one operation family, rendered as a ``ModelNew``."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from kfoundry.core.models import Candidate, ParamValue, TunableSpace

#: OpenCL helper macros naming the vector type of width VW (so the source spells vload4/vload8 ...).
OPENCL_VECTOR_HELPERS = """
#ifndef VW
#define VW 4
#endif
#if VW == 2
typedef float2 floatv;
#define VLOADV vload2
#define VSTOREV vstore2
#elif VW == 4
typedef float4 floatv;
#define VLOADV vload4
#define VSTOREV vstore4
#elif VW == 8
typedef float8 floatv;
#define VLOADV vload8
#define VSTOREV vstore8
#else
#error "VW must be 2, 4 or 8"
#endif
"""


@dataclass
class Recipe:
    """Kernel source (template parameters as macros) plus the Python that launches it."""

    name: str
    family: str
    language: str
    kernel: str
    #: Body of ``forward`` (Python, 8-space indented when rendered); ``p`` holds PARAMS.
    forward: str
    forward_args: list[str]
    space: TunableSpace
    defaults: dict[str, ParamValue]
    #: Position on the optimisation ladder (0 = naive); the generator climbs it.
    rank: int = 0
    modules: list[str] = field(default_factory=list)
    description: str = ""

    def render(self) -> str:
        """The ``ModelNew`` module source."""
        init = "".join(f"        self.m{i} = {ctor}\n" for i, ctor in enumerate(self.modules))
        body = textwrap.indent(textwrap.dedent(self.forward).strip("\n"), " " * 8)
        return f'''"""kfoundry offline cookbook: {self.name} ({self.language}). {self.description}"""

import torch
import torch.nn as nn

from kfoundry.runtime import load

# PARAMS (template parameter values) is injected by the kfoundry harness; defaults: {dict(self.defaults)!r}

KERNEL_SOURCE = r"""
{self.kernel.strip()}
"""


def _cdiv(a, b):
    return (a + b - 1) // b


class ModelNew(nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()
{init}        self.prog = load(KERNEL_SOURCE, defines=PARAMS)

    def forward(self, {", ".join(self.forward_args)}):
        p = PARAMS
{body}
'''

    def candidate(self, params: dict[str, ParamValue] | None = None, **meta: object) -> Candidate:
        """A candidate of this recipe with ``params`` (defaults for missing names)."""
        values = {**self.defaults, **(params or {})}
        values = {k: v for k, v in values.items() if k in self.space.params}
        return Candidate(
            source=self.render(),
            language=self.language,
            kind="kernelbench",
            params=values,
            space=self.space,
            generator="offline",
            label=self.name,
            meta={"recipe": self.name, "rank": self.rank, **meta},
        )


_TO_CUDA = [
    (r"__kernel\s+void", 'extern "C" __global__ void'),
    (r"__global\s+const\s+float\s*\*\s*restrict", "const float* __restrict__"),
    (r"__global\s+float\s*\*\s*restrict", "float* __restrict__"),
    (r"__global\s+", ""),
    (r"get_global_id\(0\)", "(blockIdx.x * blockDim.x + threadIdx.x)"),
    (r"get_global_id\(1\)", "(blockIdx.y * blockDim.y + threadIdx.y)"),
    (r"get_global_id\(2\)", "(blockIdx.z * blockDim.z + threadIdx.z)"),
    (r"get_local_id\(0\)", "threadIdx.x"),
    (r"get_local_id\(1\)", "threadIdx.y"),
    (r"get_group_id\(0\)", "blockIdx.x"),
    (r"get_group_id\(1\)", "blockIdx.y"),
    (r"get_group_id\(2\)", "blockIdx.z"),
    (r"__local\b", "__shared__"),
    (r"barrier\(CLK_LOCAL_MEM_FENCE\)", "__syncthreads()"),
    (r"\(long\)", "(long long)"),
    (r"\bfma\(", "fmaf("),
]


def to_cuda(source: str) -> str:
    """Translate a scalar OpenCL C kernel (no vector types) into the equivalent CUDA kernel."""
    import re

    for pattern, repl in _TO_CUDA:
        source = re.sub(pattern, repl, source)
    return source
