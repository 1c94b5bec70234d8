"""Recipes for a lowered graph (:mod:`.lower`): the schedule unfused (rank 0: a kernel per op) and fused
(rank 1: elementwise ops inlined into the kernels that read them, epilogues applied on store, matrix
products in local-memory tiles)."""

from __future__ import annotations

from kfoundry.core.models import ParamValue, TunableSpace
from kfoundry.plugins.llms.offline.lower import PY_HELPERS, Lowering, forward_body, init_source, kernel_source
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec

_BLOCKS = {"opencl": ([16, 32, 64, 128, 256], 64), "cuda": ([64, 128, 256, 512], 256)}


def lower(spec: OpSpec, language: str, fuse: bool) -> tuple[str, str]:
    """(kernel source, forward body) of ``spec``'s graph in ``language``."""
    sched = Lowering(spec.graph, language, fuse).run(len(spec.input_shapes))
    return kernel_source(sched, language), forward_body(sched).replace("self.ref", "self.m0")


def recipes(spec: OpSpec, language: str) -> list[Recipe]:
    blocks, default = _BLOCKS["cuda" if language == "cuda" else "opencl"]
    preamble = PY_HELPERS + "\n\n" + init_source(spec.source, dict(spec.dims)) + "\n"
    args = [f"x{i}" for i in range(len(spec.input_shapes))]
    out = []
    for rank, (fuse, name, what) in enumerate(
        (
            (False, "graph/unfused", "one kernel per operation"),
            (True, "graph/fused", "elementwise prologues and epilogues fused into the anchor kernels"),
        )
    ):
        kernel, forward = lower(spec, language, fuse)
        params: dict[str, list[ParamValue]] = {"BLOCK": list(blocks)}
        defaults: dict[str, ParamValue] = {"BLOCK": default}
        if "p['TILE']" in forward:  # a tiled matrix product: TILE x TILE work-groups
            params["TILE"], defaults["TILE"] = [8, 16], 16
        out.append(
            Recipe(
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
                description=what,
                preamble=preamble,
                sycl_ok=False,
            )
        )
    return out
