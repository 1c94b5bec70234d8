"""Triton elementwise recipes: a small block per program -> wide blocks -> a persistent grid-stride loop.

The reference's whole elementwise chain is one expression (the cookbook's C form, translated by
:mod:`.triton_expr`), so each element is read once and written once.
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec
from kfoundry.plugins.llms.offline.triton_expr import triton_expr
from kfoundry.plugins.llms.offline.triton_recipes import WARPS, make_recipe


def elementwise_recipes(spec: OpSpec) -> list[Recipe]:
    assert spec.expr is not None
    expr = triton_expr(spec.expr("cuda"))
    n = len(spec.input_shapes)
    ins = ", ".join(f"in{k}" for k in range(n))
    loads = "\n".join(f"    v{k} = tl.load(in{k} + offs, mask=mask)" for k in range(n))
    args = [f"x{k}" for k in range(n)]
    xs = ", ".join(f"{a}.contiguous()" for a in args)
    block = f"""
@triton.jit
def elementwise({ins}, Y, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
{loads}
    tl.store(Y + offs, {expr}, mask=mask)
"""
    launch = f"""
n = x0.numel()
y = torch.empty_like(x0)
elementwise[(triton.cdiv(n, p["BLOCK_SIZE"]),)]({xs}, y, n, BLOCK_SIZE=p["BLOCK_SIZE"], num_warps=p["num_warps"])
return y
"""
    grid_loads = "\n".join(f"        v{k} = tl.load(in{k} + offs, mask=mask)" for k in range(n))
    persistent = f"""
@triton.jit
def elementwise({ins}, Y, n, BLOCK_SIZE: tl.constexpr):
    # a persistent grid: each program strides over the data, tl.num_programs(0) blocks apart
    step = tl.num_programs(0) * BLOCK_SIZE
    for start in range(tl.program_id(0) * BLOCK_SIZE, n, step):
        offs = start + tl.arange(0, BLOCK_SIZE)
        mask = offs < n
{grid_loads}
        tl.store(Y + offs, {expr}, mask=mask)
"""
    persistent_launch = f"""
n = x0.numel()
y = torch.empty_like(x0)
programs = max(1, min(p["PROGRAMS"], triton.cdiv(n, p["BLOCK_SIZE"])))
elementwise[(programs,)]({xs}, y, n, BLOCK_SIZE=p["BLOCK_SIZE"], num_warps=p["num_warps"])
return y
"""
    return [
        make_recipe(
            "triton/elementwise/block",
            "elementwise",
            block,
            launch,
            args,
            TunableSpace(params={"BLOCK_SIZE": [64, 128, 256, 512], "num_warps": WARPS}),
            {"BLOCK_SIZE": 128, "num_warps": 2},
            0,
            "a small block of elements per program",
        ),
        make_recipe(
            "triton/elementwise/wide",
            "elementwise",
            block,
            launch,
            args,
            TunableSpace(params={"BLOCK_SIZE": [1024, 2048, 4096, 8192], "num_warps": [4, 8, 16]}),
            {"BLOCK_SIZE": 1024, "num_warps": 4},
            1,
            "wide blocks: fewer programs, more bytes in flight",
        ),
        make_recipe(
            "triton/elementwise/persistent",
            "elementwise",
            persistent,
            persistent_launch,
            args,
            TunableSpace(
                params={
                    "BLOCK_SIZE": [1024, 2048, 4096],
                    "num_warps": [4, 8],
                    "PROGRAMS": [132, 264, 528, 1056],
                }
            ),
            {"BLOCK_SIZE": 1024, "num_warps": 4, "PROGRAMS": 264},
            2,
            "a persistent grid of PROGRAMS programs striding over the data",
        ),
    ]
