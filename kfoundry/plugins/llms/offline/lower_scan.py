"""Scans and row reductions of the offline lowering: reverse scans (a flip of the scan fused into its
store) and the one-read log-sum-exp of a warp per row, eight terms per lane in flight at once."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline.elementwise_ops import fn
from kfoundry.plugins.llms.offline.lower import Val, _shape, decompose, horner

if TYPE_CHECKING:
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


def claim(L: Lowering, anchor: fx.Node, out: Val) -> None:
    """Make ``out`` (a kernel's buffer) the value of graph node ``anchor`` that the kernel computed for a
    node before it (``anchor`` is then skipped by the walk), with ``anchor``'s epilogue chain if the
    kernel applied it."""
    fo = L.order[anchor]
    L.fwd(f"S{fo} = {out.py_shape}")
    L.vals[anchor] = L.buffer_val(str(out.buffer), out.shape, f"S{fo}", out.ctype)
    chain = L.epilogue_chain(anchor) if anchor in L.applied else []
    for m in chain:
        L.fused_into[m] = anchor
    if chain:
        last = chain[-1]
        L.fwd(f"S{L.order[last]} = S{fo}")
        L.vals[last] = L.buffer_val(str(out.buffer), out.shape, f"S{L.order[last]}", out.ctype)


UNROLL8 = '_Pragma("unroll 8")'

#: Terms per row from which a reduction with a broadcast consumer runs as :func:`fused_rows`.
ROWS_MIN = 4096
#: Threads of a :func:`fused_rows` block on CUDA; elements of a row per block at most (then the row splits
#: over a cluster of up to 8 blocks).
ROWS_THREADS = 512
#: Rows from which :func:`fused_rows` applies (fewer leave SMs idle).
ROWS_MIN_ROWS = 256
ROWS_SLICE = 8192
#: Elements per thread of a block's slice up to which the CUDA :func:`fused_rows` kernel keeps the slice in
#: registers (``KF_PER``: all loads issued up front, pass 2 applies the consumer to the registers).
ROWS_REGS = 16


def broadcast_consumer(L: Lowering, node: fx.Node, shape: tuple[int, ...]) -> fx.Node | None:
    """The reduction ``node``'s only user where it is elementwise over the reduced tensor's ``shape``
    (``x / x.norm(dim, keepdim=True)``) with its other operands computed before ``node``, else None."""
    users = L.users[node]
    if len(users) != 1 or not L.fuse:
        return None
    c = users[0]
    if c.op == "output" or not L.is_elementwise(c) or _shape(c) != shape:
        return None
    for a in (*c.args, *c.kwargs.values()):
        if isinstance(a, fx.Node) and a is not node and a.op != "get_attr" and L.order[a] > L.order[node]:
            return None
    return c


def fused_rows(
    L: Lowering,
    node: fx.Node,
    src: Val,
    op: str,
    p: float,
    dims: list[int],
    in_coords: Callable[[list[str], str], list[str]],
) -> Val | None:
    """A reduction over trailing ``dims`` (sum, mean, L1 / L2 norm, kept dims) and its broadcast consumer
    in ONE kernel (the cooperative schedule): a block per row reduces it (a CUDA cluster of up to 8 blocks
    where the row is long: each block a slice, the partials merged in rank order through distributed
    shared memory, so every block gets the same total), then each block applies the consumer to its slice
    right after, while the slice it just read is in L2 (rows in flight: the resident blocks over the
    cluster size, a few MB). None where the shape or the consumer does not fit (the caller's path)."""
    nd = len(src.shape)
    if not L.coop or op not in ("sum", "mean", "norm") or (op == "norm" and p not in (1.0, 2.0)):
        return None
    if not dims or dims != list(range(nd - len(dims), nd)):
        return None
    total_r = 1
    for k in dims:
        total_r *= src.shape[k]
    rows_n = 1
    for k in range(nd - len(dims)):
        rows_n *= src.shape[k]
    # enough rows to fill the GPU (few long rows take the grid-wide split), slices of at most 2 ROWS_SLICE
    if total_r < ROWS_MIN or total_r > 16 * ROWS_SLICE or rows_n < ROWS_MIN_ROWS:
        return None
    cons = broadcast_consumer(L, node, src.shape)
    if cons is None:
        return None
    f = lambda name: fn(name, L.lang)  # noqa: E731
    n = L.order[cons]
    S = f"S{n}"
    L.fwd(f"{S} = {src.py_shape}")
    out = src.shape
    odims = L.shape_dims(S, out)
    kept = list(range(nd - len(dims)))
    kd = [odims[k] for k in kept]
    rows = " * ".join(f"(kf_long){d}" for d in kd) or "1"
    count = " * ".join(f"(kf_long){odims[k]}" for k in dims)
    cs = [f"c{k}" for k in kept]
    decomp = decompose("row", kd, cs, "rows")
    term = {
        "norm": (lambda v: f"(({v}) * ({v}))") if p == 2.0 else (lambda v: f"{f('fabs')}({v})"),
    }.get(op, lambda v: v)
    final = {"mean": f"tot = tot / (float)({count});", "norm": f"tot = {f('sqrt')}(tot);" if p == 2.0 else ""}
    at = in_coords([*cs, *["0"] * len(dims)], "q")  # a row's coordinates at its flat reduced index q
    store_epi, ctype, _ = L.epilogue(cons, out, at, "float")
    value = L.elementwise_expr(cons, at, out, {node: "tot"})
    cuda = L.lang == "cuda"
    nt = str(ROWS_THREADS) if cuda else "BLOCK"
    tid = "(kf_long)threadIdx.x" if cuda else "(kf_long)get_local_id(0)"
    if cuda:
        rank, ncl = "(kf_long)blockIdx.x", "KF_CL"
        row0, rstep = "(kf_long)blockIdx.y", "(kf_long)gridDim.y"
        # kf_part double-buffered by the parity of the block's row step kf_it (the same in every block of the
        # cluster: they share blockIdx.y): a block writes slot s at step k only after the wait of step k - 1's
        # cluster barrier, which every thread of the cluster reaches after its reads of slot s at step k - 2
        # (arrive releases them), so no second barrier per row; the reads of the last step are closed by the
        # arrive right after them, waited for before the block exits (its shared memory must outlive them)
        shared = "    __shared__ float kf_red[32]; __shared__ float kf_part[2];\n"
        block_sum = (
            "        part = kf_wsum(part);\n"
            "        if ((threadIdx.x & 31) == 0) kf_red[threadIdx.x >> 5] = part;\n"
            "        __syncthreads();\n"
            f"        if (threadIdx.x < 32) {{ float w = threadIdx.x < {nt} / 32 ? kf_red[threadIdx.x] : 0.0f; "
            "w = kf_wsum(w); if (threadIdx.x == 0) kf_part[kf_it & 1] = w; }\n"
            "#if KF_CL > 1\n"
            "        __cluster_barrier_arrive(); __cluster_barrier_wait();\n"
            "        float tot = 0.0f;\n"
            "        #pragma unroll\n"
            "        for (int rk = 0; rk < KF_CL; ++rk) tot += *static_cast<float*>(__cluster_map_shared_rank(&kf_part[kf_it & 1], rk));\n"
            f"        if (row + {rstep} >= rows) __cluster_barrier_arrive();  // the last row's reads done: waited for at exit\n"
            "#else\n"
            "        __syncthreads();\n"
            "        float tot = kf_part[kf_it & 1];\n"
            "#endif\n"
        )
    else:
        rank, ncl = "(kf_long)0", "1"
        row0, rstep = "(kf_long)get_group_id(0)", "(kf_long)get_num_groups(0)"
        shared = "    __local float kf_red[BLOCK];\n"
        block_sum = (
            "        kf_red[get_local_id(0)] = part;\n"
            "        barrier(CLK_LOCAL_MEM_FENCE);\n"
            "        for (int s = BLOCK / 2; s > 0; s >>= 1) {\n"
            "            if ((int)get_local_id(0) < s) kf_red[get_local_id(0)] += kf_red[get_local_id(0) + s];\n"
            "            barrier(CLK_LOCAL_MEM_FENCE);\n"
            "        }\n"
            "        float tot = kf_red[0];\n"
            "        barrier(CLK_LOCAL_MEM_FENCE);\n"
        )
    ydims = [odims[k] for k in range(nd)]
    load = src.load(at)
    pass1 = (
        f"        float part = 0.0f;\n"
        f"        {UNROLL8} for (kf_long q = lo + {tid}; q < hi; q += {nt}) {{\n"
        f"            part += {term(load)};\n        }}\n"
    )
    store = f"y[{horner(at, ydims)}] = {store_epi};"
    pass2 = (
        f"        {UNROLL8} for (kf_long q = lo + {tid}; q < hi; q += {nt}) {{\n"
        f"            float acc = {value};\n"
        f"            {store}\n        }}\n"
    )
    regs = cuda and src.ctype == "float"
    if regs:
        # KF_PER > 0 (the slice's elements per thread, at most ROWS_REGS): the thread's elements q = lo + tid +
        # 512 u in registers, all loads issued before the first add (zeros past hi: terms of 0 add nothing,
        # the per-thread order is the loop's); the consumer reads them where it loads src at the same
        # coordinates (the same text: other loads stay global)
        q_u = f"const kf_long q = lo + {tid} + (kf_long)u * {nt};"
        # where src is a fused elementwise function of one buffer access (l1 norm's fabsf(x)) that the
        # consumer reads raw (x / sum), the raw access is what the registers hold
        raw = _raw_access(load, value + store)
        on_regs = lambda e: re.sub(r"(?<![\w.])" + re.escape(raw), "kf_v[u]", e)  # noqa: E731
        folded = term(on_regs(load)) if raw == load else f"(q < hi ? {term(on_regs(load))} : 0.0f)"
        pass1 = (
            "#if KF_PER > 0\n"
            "        float kf_v[KF_PER];\n"
            "        #pragma unroll\n"
            f"        for (int u = 0; u < KF_PER; ++u) {{ {q_u} kf_v[u] = q < hi ? ({raw}) : 0.0f; }}\n"
            "        float part = 0.0f;\n"
            "        #pragma unroll\n"
            f"        for (int u = 0; u < KF_PER; ++u) {{ {q_u} part += {folded}; }}\n"
            f"#else\n{pass1}#endif\n"
        )
        pass2 = (
            "#if KF_PER > 0\n"
            "        #pragma unroll\n"
            f"        for (int u = 0; u < KF_PER; ++u) {{\n"
            f"            {q_u}\n"
            f"            if (q < hi) {{ float acc = {on_regs(value)}; {on_regs(store)} }}\n        }}\n"
            f"#else\n{pass2}#endif\n"
        )
    loop = (
        f"    kf_long kf_it = 0;\n    for (kf_long row = {row0}; row < rows; row += {rstep}, ++kf_it) {{\n"
        if cuda
        else f"    for (kf_long row = {row0}; row < rows; row += {rstep}) {{\n"
    )
    text = (
        f"{shared}"
        f"    const kf_long rows = {rows};\n"
        f"    const kf_long cnt = {count};\n"
        f"    const kf_long slice = (cnt + {ncl} - 1) / {ncl};\n"
        f"    const kf_long lo = {rank} * slice, hi = lo + slice < cnt ? lo + slice : cnt;\n"
        f"{loop}{decomp}"
        f"{pass1}"
        f"{block_sum}"
        f"        {final.get(op, '')}\n"
        f"{pass2}"
        f"    }}"
    )
    if cuda:  # a block that ran no row arrives here; none exits before every block has read its kf_part
        text += (
            "\n#if KF_CL > 1\n"
            f"    if ({row0} >= rows) __cluster_barrier_arrive();\n"
            "    __cluster_barrier_wait();\n"
            "#endif"
        )
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty({S}, dtype=torch.float32, device=dev)")
    rows_py = " * ".join(f"{S}[{k}]" for k in kept) or "1"
    count_py = " * ".join(f"{S}[{k}]" for k in dims)
    if cuda:
        L.fwd(f"_kf_cl = max(1, min(8, _cdiv({count_py}, {ROWS_SLICE})))")
        # RG waves of clusters over 132 SMs (the H200's; another count only changes the waves), each cluster
        # looping over its rows (RG 0: a cluster per row)
        L.fwd(f"_kf_rg = {rows_py} if p['RG'] == 0 else max(1, p['RG'] * 132 // _kf_cl)")
        if regs:  # a thread's elements of its block's slice, in registers where at most ROWS_REGS
            L.fwd(f"_kf_per = _cdiv(_cdiv({count_py}, _kf_cl), {ROWS_THREADS})")
            L.fwd(f"_kf_per = _kf_per if _kf_per <= {ROWS_REGS} else 0")
        launch = f"grid=(_kf_cl, max(1, min({rows_py}, _kf_rg, 65535)), 1), block=({ROWS_THREADS}, 1, 1)"
    else:
        launch = f"grid=(max(1, min({rows_py}, 65535)), 1, 1), block=(p['BLOCK'], 1, 1)"
    name = L.kernel(text, ctype, "", "rows", launch_dims=launch)
    kern = L.sched.kernels[-1]
    if cuda:
        kern.source = "#ifndef KF_CL\n#define KF_CL 1\n#endif\n#ifndef KF_PER\n#define KF_PER 0\n#endif\n" + (
            kern.source.replace(
                f"KF_KERNEL {kern.name}(",
                f"KF_KERNEL __cluster_dims__(KF_CL, 1, 1) __launch_bounds__({ROWS_THREADS}) {kern.name}(",
            )
        )
        defines = "KF_CL=_kf_cl, KF_PER=_kf_per" if regs else "KF_CL=_kf_cl"
        kern.launch = kern.launch.replace("self.prog.", f"self._program({defines}).")
    L.fwd(kern.launch)
    res = L.buffer_val(name, out, S, ctype)
    claim(L, cons, res)
    # the reduction itself is not materialised (its one user is the kernel's)
    return Val(src.shape, src.dims, _no_load, f"S{L.order[node]}")


def _raw_access(load: str, consumer: str) -> str:
    """What the register-resident slice holds: ``load`` itself, or the one buffer access inside it
    (``fabsf(buf0[i])``'s ``buf0[i]``) where the consumer reads that access but not ``load``."""
    if load in consumer:
        return load
    accesses = set(re.findall(r"\bbuf\d+\[[^\[\]]*\]", load))
    if len(accesses) == 1 and (acc := accesses.pop()) in consumer:
        return acc
    return load


def _no_load(c: list[str]) -> str:
    raise AssertionError("a reduction fused with its consumer has no buffer")
