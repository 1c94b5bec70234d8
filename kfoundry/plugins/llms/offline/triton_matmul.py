"""Triton matrix-product recipes: C = A @ B (+ bias) with the reference's elementwise epilogue fused.

Ladder: rank-1 updates of a register tile (no ``tl.dot``) -> ``tl.dot`` over BLOCK_K slices -> the
same in a grouped (L2-friendly) program order with software pipelining (``num_stages``). For
``nn.Linear`` the weight ``[N, K]`` is read transposed through its strides (no copy). Products are
exact fp32 (``input_precision="ieee"``), as the reference computes them.
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.recipe import Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec
from kfoundry.plugins.llms.offline.triton_expr import triton_expr
from kfoundry.plugins.llms.offline.triton_recipes import WARPS, make_recipe

_TILE = "BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr"


def _epilogue(spec: OpSpec) -> str:
    bias = "    v = v + tl.load(BIAS + rn, mask=rn < N, other=0.0)[None, :]\n" if spec.bias else ""
    expr = f"    v = {triton_expr(spec.expr('cuda'))}\n" if spec.expr is not None else ""
    return bias + expr


def _kernel(spec: OpSpec, body: str, extra: str = "") -> str:
    bias = "BIAS, " if spec.bias else ""
    return (
        "@triton.jit\n"
        f"def matmul(A, B, {bias}C, M, N, K, sam, sak, sbk, sbn, scm, scn, {_TILE}{extra}):\n"
        + body
        + "    v = acc\n"
        + _epilogue(spec)
        + "    tl.store(C + rm[:, None] * scm + rn[None, :] * scn, v, mask=(rm[:, None] < M) & (rn[None, :] < N))\n"
    )


_PLAIN_ORDER = (
    "    pid_n = tl.program_id(0)\n    pid_m = tl.program_id(1)\n"
    "    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\n    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)\n"
)
_GROUPED_ORDER = (
    "    # grouped order: GROUP_M row blocks share each column block of B while it is in L2\n"
    "    pid = tl.program_id(0)\n    num_m = tl.cdiv(M, BLOCK_M)\n    num_n = tl.cdiv(N, BLOCK_N)\n"
    "    group = GROUP_M * num_n\n    first_m = (pid // group) * GROUP_M\n"
    "    rows = tl.minimum(num_m - first_m, GROUP_M)\n"
    "    pid_m = first_m + (pid % group) % rows\n    pid_n = (pid % group) // rows\n"
    "    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\n    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)\n"
)
_DOT_LOOP = (
    "    rk = tl.arange(0, BLOCK_K)\n    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n"
    "    for k in range(0, K, BLOCK_K):\n"
    "        ks = k + rk\n"
    "        a = tl.load(A + rm[:, None] * sam + ks[None, :] * sak, mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)\n"
    "        b = tl.load(B + ks[:, None] * sbk + rn[None, :] * sbn, mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0)\n"
    '        acc += tl.dot(a, b, input_precision="ieee")\n'
)
_RANK1_LOOP = (
    "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n"
    "    for k in range(0, K):\n"
    "        a = tl.load(A + rm * sam + k * sak, mask=rm < M, other=0.0)\n"
    "        b = tl.load(B + k * sbk + rn * sbn, mask=rn < N, other=0.0)\n"
    "        acc += a[:, None] * b[None, :]\n"
)


def _forward(spec: OpSpec, grid: str, launch_extra: str = "") -> tuple[str, list[str]]:
    bias = "self.m0.bias, " if spec.bias else ""
    if spec.linear:
        head = (
            "M, K = x.shape\nw = self.m0.weight\nN = w.shape[0]\n"
            "c = torch.empty((M, N), dtype=x.dtype, device=x.device)\n"
            "a, b, sbk, sbn = x, w, w.stride(1), w.stride(0)  # B[k, n] = W[n, k]: the weight read transposed\n"
        )
        args = ["x"]
    else:
        head = (
            "M, K = a.shape\nN = b.shape[1]\nc = torch.empty((M, N), dtype=a.dtype, device=a.device)\n"
            "sbk, sbn = b.stride(0), b.stride(1)\n"
        )
        args = ["a", "b"]
    call = (
        f"matmul[{grid}](a, b, {bias}c, M, N, K, a.stride(0), a.stride(1), sbk, sbn, c.stride(0), c.stride(1), "
        f'BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], BLOCK_K=p["BLOCK_K"], num_warps=p["num_warps"]{launch_extra})\n'
    )
    return head + call + "return c\n", args


def matmul_recipes(spec: OpSpec) -> list[Recipe]:
    plain_grid = '(triton.cdiv(N, p["BLOCK_N"]), triton.cdiv(M, p["BLOCK_M"]))'
    grouped_grid = '(triton.cdiv(M, p["BLOCK_M"]) * triton.cdiv(N, p["BLOCK_N"]),)'
    rank1_fwd, args = _forward(spec, plain_grid)
    dot_fwd, _ = _forward(spec, plain_grid)
    grouped_fwd, _ = _forward(spec, grouped_grid, ', GROUP_M=p["GROUP_M"], num_stages=p["num_stages"]')
    tiles = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "BLOCK_K": [16, 32, 64]}
    return [
        make_recipe(
            "triton/matmul/rank1",
            "matmul",
            _kernel(spec, _PLAIN_ORDER + _RANK1_LOOP),
            rank1_fwd,
            args,
            TunableSpace(
                params={"BLOCK_M": [16, 32, 64], "BLOCK_N": [16, 32, 64], "BLOCK_K": [16], "num_warps": WARPS}
            ),
            {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4},
            0,
            "a register tile per program, rank-1 updates (no tl.dot)",
            modules=spec.modules,
        ),
        make_recipe(
            "triton/matmul/dot",
            "matmul",
            _kernel(spec, _PLAIN_ORDER + _DOT_LOOP),
            dot_fwd,
            args,
            TunableSpace(params={**tiles, "num_warps": [2, 4, 8]}),
            {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4},
            1,
            "tl.dot over BLOCK_K slices of A and B",
            modules=spec.modules,
        ),
        make_recipe(
            "triton/matmul/grouped",
            "matmul",
            _kernel(spec, _GROUPED_ORDER + _DOT_LOOP, ", GROUP_M: tl.constexpr"),
            grouped_fwd,
            args,
            TunableSpace(params={**tiles, "num_warps": [4, 8], "GROUP_M": [4, 8], "num_stages": [2, 3, 4]}),
            {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "GROUP_M": 8, "num_stages": 3},
            2,
            "tl.dot tiles in a grouped program order, software-pipelined (num_stages)",
            modules=spec.modules,
        ),
    ]
