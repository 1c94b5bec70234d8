"""Recipes for a lowered graph (:mod:`.lower`): the schedule unfused (rank 0: a kernel per op), fused
(rank 1: elementwise ops inlined into the kernels that read them, epilogues applied on store, matrix
products in local-memory tiles) and, on CUDA, fused and cooperative (rank 2: long reductions a warp per
output with shuffle merges, ILP elements per thread elsewhere, register-blocked matrix products)."""

from __future__ import annotations

import re

from kfoundry.core.models import ParamValue, TunableSpace
from kfoundry.plugins.llms.offline import lower_conv
from kfoundry.plugins.llms.offline.index_width import adapt
from kfoundry.plugins.llms.offline.lower import (
    PY_HELPERS,
    QU_DEFAULT,
    Lowering,
    forward_body,
    init_source,
    kernel_source,
)
from kfoundry.plugins.llms.offline.normalize_linear_sum import REWRITES
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec

_BLOCKS = {"opencl": ([16, 32, 64, 128, 256], 64), "cuda": ([64, 128, 256, 512], 256)}


def lower(spec: OpSpec, language: str, fuse: bool, coop: bool = False) -> tuple[str, str, Lowering]:
    """(kernel source, forward body, the lowering: its products' and convolutions' sizes) of ``spec``'s graph."""
    low = Lowering(spec.graph, language, fuse, coop)
    sched = low.run(len(spec.input_shapes))
    return (
        kernel_source(sched, language, coop),
        hoist_module_reads(forward_body(sched).replace("self.ref", "self.m0")),
        low,
    )


_MODULE_READ = re.compile(r"self\.m0(?:\.[A-Za-z_]\w*|\[\d+\])+(?![\w(])")
_STEP = re.compile(r"\.[A-Za-z_]\w*|\[\d+\]")


def hoist_module_reads(forward: str) -> str:
    """``forward`` reading each prefix of each ``self.m0...`` chain (a submodule, a parameter, a stride)
    once, into a local, at the top: a submodule's or a parameter's read goes through
    ``nn.Module.__getattr__``, microseconds of each call's host time."""
    reads = list(dict.fromkeys(_MODULE_READ.findall(forward)))
    names: dict[str, str] = {"self": "self"}
    lines: list[str] = []
    for read in reads:
        prefix = "self"
        for step in _STEP.findall(read[len("self") :]):
            parent, prefix = prefix, prefix + step
            if prefix not in names:
                names[prefix] = f"_m{len(lines)}"
                lines.append(f"{names[prefix]} = {names[parent]}{step}\n")
    body = _MODULE_READ.sub(lambda m: names[m.group(0)], forward)
    return "".join(lines) + body


def _register_block(mm_sizes: list[tuple[int, int]]) -> int:
    """The largest RB (tile 16RB x 16RB) that still gives the largest product two tiles per SM of an H200."""
    outputs, batch = max(mm_sizes)
    for rb in (8, 4):
        if outputs * batch // (16 * rb) ** 2 >= 2 * 132:
            return rb
    return 2


def _conv_blocks(conv_sizes: list[tuple[int, int, int]]) -> tuple[int, int]:
    """(CM, CN) of the largest implicit-GEMM convolution: :func:`.lower_conv.conv_blocks`."""
    return lower_conv.conv_blocks(conv_sizes)


_VARIANTS = {
    "graph/unfused": (False, False, "one kernel per operation"),
    "graph/fused": (True, False, "elementwise prologues and epilogues fused into the anchor kernels"),
    "graph/fused_coop": (
        True,
        True,
        "fused; long reductions a warp per output (shuffle merges), ILP elements per thread, "
        "register-blocked matrix products",
    ),
}


def recipe(spec: OpSpec, language: str, name: str, rank: int) -> Recipe:
    """The ``name`` variant of :data:`_VARIANTS` for ``spec``'s graph in ``language``. The cooperative
    one is offered on CUDA only; on OpenCL it runs one 32-item work-group per "warp" (BLOCK 32, the
    tests' check of its logic on PoCL)."""
    fuse, coop, what = _VARIANTS[name]
    blocks, default = _BLOCKS["cuda" if language == "cuda" else "opencl"]
    if coop and language != "cuda":
        blocks, default = [32], 32
    preamble = PY_HELPERS + "\n\n" + init_source(spec.source, dict(spec.dims)) + "\n"
    args = [f"x{i}" for i in range(len(spec.input_shapes))]
    kernel, forward, low = lower(spec, language, fuse, coop)
    params: dict[str, list[ParamValue]] = {"BLOCK": list(blocks)}
    defaults: dict[str, ParamValue] = {"BLOCK": default}
    if "p['TILE']" in forward:  # a tiled matrix product: TILE x TILE work-groups
        params["TILE"], defaults["TILE"] = [8, 16], 16
    if coop:
        params["ILP"], defaults["ILP"] = [1, 2, 4], 4
    if "p['RB']" in forward:  # a register-blocked product: 16RB x 16RB tiles
        params["RB"], defaults["RB"] = [2, 4, 8], _register_block(low.mm_sizes)
    if "p.get('QU'" in forward and language == "cuda":  # pointwise quads: QU of them per thread and step
        params["QU"], defaults["QU"] = [1, 2, 4], QU_DEFAULT["cuda"]
    if "p['RG']" in forward:  # a fused row reduction: RG waves of persistent clusters (0: one per row)
        # on the H200 (session 13, l1/l2 norm 32768 x 65535): RG 0 9.06-9.17 ms, 32 9.35, 8 10.24, 2 15.1
        params["RG"], defaults["RG"] = [0, 2, 8, 32], 0
    if coop and language == "cuda" and "KF_SU" in kernel.split("#define KF_SU", 1)[-1]:
        # a warp scan (cumsum, cumprod): KF_SU x 32 elements of a row per step, their loads in flight together
        params["KF_SU"], defaults["KF_SU"] = [4, 8], 4
    if "p['SW']" in forward:  # a normalisation stream: SW work-groups per SM, pieces of SP x 4096 elements
        # an H100 sweep (session 14, call 2): SW 3 at BLOCK 128 group norm 7.31 ms, instance norm 6.48 (SW 2 at
        # BLOCK 256, before: 7.40 and 7.57); BLOCK 512 was the slowest at every SW; SP 2 helped only at SW 2
        params["SW"], params["SP"] = [2, 3, 4], [1, 2]
        defaults["SW"], defaults["SP"], defaults["BLOCK"] = 3, 1, 128
    if "p['CM']" in forward:  # an implicit-GEMM convolution: 16CM x 16CN tiles
        params["CM"], params["CN"] = [1, 2, 4, 8], [2, 4, 8, 16]
        defaults["CM"], defaults["CN"] = _conv_blocks(low.conv_sizes)
    return Recipe(
        name,
        "graph",
        language,
        kernel,
        forward,
        args,
        TunableSpace(params=params),
        defaults,
        rank=rank,
        modules=["_RefInit(*init_inputs)"],
        description="; ".join([what, *spec.graph.meta.get(REWRITES, [])]),
        preamble=preamble,
        sycl_ok=False,
    )


def recipes(spec: OpSpec, language: str) -> list[Recipe]:
    names = ["graph/unfused", "graph/fused"] + (["graph/fused_coop"] if language == "cuda" else [])
    return adapt([recipe(spec, language, name, rank) for rank, name in enumerate(names)], spec)
