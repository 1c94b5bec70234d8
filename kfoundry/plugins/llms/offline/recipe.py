"""A cookbook recipe: one optimisation step for one operation family, rendered as a ``ModelNew``."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field, replace

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
    #: Python dict expression of further defines computed in ``__init__`` from the modules (``self.m0``...).
    init_defines: str = ""
    #: The program needs defines computed from the inputs' shapes: no program is built in ``__init__``;
    #: ``forward`` asks ``self._program(NAME=value, ...)`` (one build per distinct value set, cached).
    lazy: bool = False
    #: False where the kernel uses OpenCL vector selects (``?:`` on vectors) that :func:`to_sycl` cannot map.
    sycl_ok: bool = True
    #: Module-level Python placed before ``ModelNew`` (helpers, the parameter holder of a lowered graph).
    preamble: str = ""

    def render(self) -> str:
        """The ``ModelNew`` module source: every size is read from the inputs in ``forward``."""
        init = "".join(f"        self.m{i} = {ctor}\n" for i, ctor in enumerate(self.modules))
        body = textwrap.indent(textwrap.dedent(self.forward).strip("\n"), " " * 8)
        extra = f"**{self.init_defines}" if self.init_defines else ""
        build = "" if self.lazy else "        self.prog = self._program()\n"
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


def _prod(dims):
    out = 1
    for d in dims:
        out *= d
    return out


def _aligned(*tensors):
    return all(t.data_ptr() % 16 == 0 for t in tensors)

{self.preamble}

class ModelNew(nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()
{init}        self.defines = {{**PARAMS, {extra}}}
        self.programs = {{}}
{build}
    def _program(self, **shape):
        key = tuple(sorted(shape.items()))
        if key not in self.programs:
            self.programs[key] = load(KERNEL_SOURCE, defines={{**self.defines, **shape}})
        return self.programs[key]

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
    for pattern, repl in _TO_CUDA:
        source = re.sub(pattern, repl, source)
    return source


# -- SYCL: scalar OpenCL C recipes translated into SYCL free-function kernels --------------------------

SYCL_HEADER = """#include <sycl/sycl.hpp>
namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;
"""


#: :data:`OPENCL_VECTOR_HELPERS` for SYCL: ``floatv`` is ``sycl::vec<float, VW>``, VLOADV/VSTOREV move VW floats.
SYCL_VECTOR_HELPERS = """
#ifndef VW
#define VW 4
#endif
#if VW != 2 && VW != 4 && VW != 8
#error "VW must be 2, 4 or 8"
#endif
typedef sycl::vec<float, VW> floatv;
static inline floatv kf_vload(size_t i, const float* p) {
    floatv v;
    #pragma unroll
    for (int u = 0; u < VW; ++u) v[u] = p[i * VW + u];
    return v;
}
static inline void kf_vstore(const floatv& v, size_t i, float* p) {
    #pragma unroll
    for (int u = 0; u < VW; ++u) p[i * VW + u] = v[u];
}
#define VLOADV(i, p) kf_vload((i), (p))
#define VSTOREV(v, i, p) kf_vstore((v), (i), (p))
"""


class Untranslatable(ValueError):
    """The OpenCL source uses something :func:`to_sycl` does not map (vector types, sub-groups, atomics...)."""


#: OpenCL constructs with no translation here: the recipe is skipped on SYCL.
_SYCL_REFUSE = re.compile(
    r"\b(float|int|uint|half|double)(2|3|4|8|16)\b|\bvload\w*|\bvstore\w*"
    r"|\bsub_group_\w+|\bintel_\w+|\batomic_\w+|\batom_\w+|\bwork_group_\w+|\bconvert_\w+|\bas_(float|int|uint)\b"
    r"|\basync_work_group_copy\b|\b__constant\b|\b__attribute__|#pragma\s+OPENCL|\bnative_\w+|\bhalf_\w+"
)

#: work-item functions: OpenCL name -> sycl::nd_item member (the launch's dimension i is SYCL dimension i)
_SYCL_IDS = {
    "get_global_id": "get_global_id",
    "get_local_id": "get_local_id",
    "get_group_id": "get_group",
    "get_local_size": "get_local_range",
    "get_num_groups": "get_group_range",
    "get_global_size": "get_global_range",
}
_SYCL_ID_CALL = re.compile(r"\b(" + "|".join(_SYCL_IDS) + r")\s*\(\s*([0-2])\s*\)")

#: OpenCL built-in math called unqualified -> sycl:: (sycl::erf for the cookbook's kf_erf helper).
_SYCL_MATH = (
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log1p",
    "sqrt",
    "rsqrt",
    "fabs",
    "fmax",
    "fmin",
    "fma",
    "mad",
    "tanh",
    "erf",
    "sin",
    "cos",
    "tan",
    "pow",
    "pown",
    "copysign",
    "floor",
    "ceil",
    "min",
    "max",
    "clamp",
)
_SYCL_MATH_CALL = re.compile(r"(?<![\w.:])(" + "|".join(_SYCL_MATH) + r")\s*\(")
_SYCL_LOCAL = re.compile(r"__local\s+(\w+)\s+(\w+)\s*((?:\[[^\]\n]+\])+)\s*;")
_SYCL_KERNEL = re.compile(r"__kernel\s+void\s+(\w+)\s*\(")


def _matching(text: str, start: int, open_: str, close: str) -> int:
    """Index just past the ``close`` that matches the ``open_`` at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
    raise Untranslatable(f"unbalanced {open_}{close}")


def to_sycl(source: str) -> str:
    """Translate a scalar OpenCL C program into SYCL free-function kernels (:class:`Untranslatable` if it can't).

    ``__kernel void f(...)`` becomes ``extern "C"`` with ``nd_range_kernel<N>`` (N: the highest work-item
    dimension the kernel queries, plus one) and ``get_*_id(d)`` reads dimension ``d`` of the kernel's
    ``nd_item``, so the launch's ``grid``/``block`` keep their meaning; ``__local T a[N]...;`` becomes
    ``syclexp::work_group_static<T[N]...>``, ``barrier(...)`` a ``sycl::group_barrier`` and the math
    built-ins their ``sycl::`` namesakes. Vector code written with :data:`OPENCL_VECTOR_HELPERS`
    (``floatv``, ``VLOADV``, ``VSTOREV``) uses ``sycl::vec<float, VW>``; other vector types are refused.
    """
    from kfoundry.plugins.llms.offline.elementwise_ops import OPENCL_MATH_PRELUDE

    source = source.replace(OPENCL_MATH_PRELUDE, "").replace("kf_erf(", "erf(")
    source = source.replace(OPENCL_VECTOR_HELPERS, SYCL_VECTOR_HELPERS)
    if m := _SYCL_REFUSE.search(source):
        raise Untranslatable(f"no SYCL translation for {m.group(0)!r}")
    out, pos = [], 0
    for m in _SYCL_KERNEL.finditer(source):
        if m.start() < pos:
            continue
        params_end = _matching(source, m.end() - 1, "(", ")")
        body_start = source.index("{", params_end)
        body_end = _matching(source, body_start, "{", "}")
        body = source[body_start + 1 : body_end - 1]
        dims = [int(d) for _, d in _SYCL_ID_CALL.findall(body)]
        nd = max(dims, default=0) + 1
        body = _SYCL_ID_CALL.sub(lambda c: f"kf_it.{_SYCL_IDS[c.group(1)]}({c.group(2)})", body)
        body = re.sub(
            r"\bbarrier\s*\(\s*CLK_\w+(\s*\|\s*CLK_\w+)*\s*\)", "sycl::group_barrier(kf_it.get_group())", body
        )
        body = _SYCL_LOCAL.sub(
            lambda a: f"syclexp::work_group_static<{a.group(1)}{a.group(3)}> {a.group(2)};", body
        )
        out += [
            source[pos : m.start()],
            f'extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<{nd}>))\nvoid {m.group(1)}',
            source[m.end() - 1 : body_start],
            f"{{\n    auto kf_it = syclext::this_work_item::get_nd_item<{nd}>();{body}}}",
        ]
        pos = body_end
    if not out:
        raise Untranslatable("no __kernel function")
    text = "".join([*out, source[pos:]])
    if m := re.search(r"(?<![.\w])(__local|barrier|get_\w+_id|get_\w+_size|get_num_groups)\b", text):
        raise Untranslatable(f"{m.group(0)!r} outside a kernel or in an unsupported form")
    for pattern, repl in (
        (r"\b__global\s+", ""),
        (r"\b__private\s+", ""),
        (r"\brestrict\b", "__restrict__"),
        (r"\bINFINITY\b", "std::numeric_limits<float>::infinity()"),
    ):
        text = re.sub(pattern, repl, text)
    text = _SYCL_MATH_CALL.sub(lambda c: f"sycl::{c.group(1)}(", text)
    return SYCL_HEADER + text.lstrip("\n")


#: Parameter ranges that differ on SYCL (measured on the Intel OpenCL CPU device: it vectorises across the
#: work-items of a work-group, so the one-element-per-item kernel wants large work-groups).
_SYCL_SPACES: dict[str, tuple[dict[str, list[ParamValue]], dict[str, ParamValue]]] = {
    "elementwise/naive": ({"BLOCK_X": [64, 128, 256, 512, 1024]}, {"BLOCK_X": 256}),
}


def sycl_recipe(recipe: Recipe) -> Recipe | None:
    """The SYCL twin of an OpenCL ``recipe`` (same launch and parameters), None if it can't be translated."""
    if not recipe.sycl_ok:
        return None
    try:
        kernel = to_sycl(recipe.kernel)
    except Untranslatable:
        return None
    space, defaults = recipe.space.model_copy(deep=True), dict(recipe.defaults)
    if recipe.name in _SYCL_SPACES:
        params, new_defaults = _SYCL_SPACES[recipe.name]
        space.params.update({k: list(v) for k, v in params.items()})
        defaults.update(new_defaults)
    return replace(
        recipe, language="sycl", kernel=kernel, space=space, defaults=defaults, modules=list(recipe.modules)
    )
