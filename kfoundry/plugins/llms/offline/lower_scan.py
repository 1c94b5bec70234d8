"""Scans and row reductions of the offline lowering: reverse scans (a flip of the scan fused into its
store) and the one-read log-sum-exp of a warp per row, eight terms per lane in flight at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline.lower import _shape

if TYPE_CHECKING:
    from collections.abc import Callable

    from kfoundry.plugins.llms.offline.lower import Lowering


def flipped_user(L: Lowering, node: fx.Node, d: int) -> fx.Node | None:
    """The scan ``node``'s only user where it is a flip of exactly dim ``d`` (a reverse scan), else None."""
    users = L.users[node]
    if len(users) != 1 or users[0].op not in ("call_function", "call_method"):
        return None
    f = users[0]
    name = f.target if f.op == "call_method" else getattr(f.target, "__name__", "")
    if name != "flip" or not f.args or f.args[0] is not node:
        return None
    if len(f.args) > 2:
        ds: object = list(f.args[1:])
    else:
        ds = f.args[1] if len(f.args) > 1 else f.kwargs.get("dims")
    ds = [ds] if isinstance(ds, int) else ds
    if not isinstance(ds, list | tuple) or not ds or not all(isinstance(x, int) for x in ds):
        return None
    nd = len(_shape(node))
    if {int(x) % nd for x in ds} != {d}:
        return None
    return f


#: Terms per lane that one step of :func:`lane_lse` loads together (their loads in flight at once).
LSE_ILP = 8


def lane_lse(L: Lowering, count: str, x: Callable[[str], str], exp: str, log: str, ilp: int = LSE_ILP) -> str:
    """``float acc`` = logsumexp of ``x(q)`` for q < count across the lanes of a warp, in one read: each
    step a lane loads ``ilp`` terms (lane-strided, coalesced; all in flight together), folds their max into
    its running max ``mx`` and rescales its sum once per step (not per growing term: no branch per
    element); then the lanes' (max, sum) pairs merge. NaN propagates, -inf terms add nothing, an
    infinite max is the result (torch's values)."""
    q0, q = L.fresh("q"), L.fresh("q")
    span = 32 * ilp
    return (
        f"float mx = -INFINITY, acc = 0.0f;\n"
        f"        for (kf_long {q0} = 0; {q0} < (kf_long)({count}); {q0} += {span}) {{\n"
        f"            float kv[{ilp}];\n"
        f"            #pragma unroll\n"
        f"            for (int u = 0; u < {ilp}; ++u) {{ const kf_long {q} = {q0} + 32 * u + kf_lane; "
        f"kv[u] = {q} < (kf_long)({count}) ? ({x(q)}) : -INFINITY; }}\n"
        f"            float mn = mx;\n"
        f"            #pragma unroll\n"
        f"            for (int u = 0; u < {ilp}; ++u) mn = (kv[u] > mn || kv[u] != kv[u]) ? kv[u] : mn;\n"
        f"            if (mn != -INFINITY) {{\n"
        f"                float s = mn == mx ? acc : acc * {exp}(mx - mn);\n"
        f"                #pragma unroll\n"
        f"                for (int u = 0; u < {ilp}; ++u) s += {exp}(kv[u] - mn);\n"
        f"                acc = s;\n"
        f"            }}\n"
        f"            mx = mn;\n"
        f"        }}\n"
        f"        {{ const float mw = kf_wmax(mx); acc = mx == -INFINITY ? 0.0f : (mx == mw ? acc : acc * "
        f"{exp}(mx - mw)); acc = kf_wsum(acc); mx = mw; }}\n"
        f"        acc = (mx == INFINITY || mx == -INFINITY) ? mx : mx + {log}(acc);"
    )
