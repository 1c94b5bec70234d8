"""Long reductions with few outputs of a *loader* (a fused expression such as a loss's per-element
term, not a plain buffer) split across the grid in two kernels.

Stage 1: for each output, ``G`` work-groups each fold a contiguous piece of the reduction's terms
into a partial in a scratch buffer; ``G`` is chosen in ``forward`` from the sizes so that the grid has
thousands of work-groups. Where the innermost reduced dim is long, a piece is a run of whole rows of it:
the outer reduced coordinates are decomposed once per row and the innermost one is the loop counter (no
division per element). There every buffer load of the term that reads four consecutive elements of the
row (:class:`_Quads`) becomes one 16-byte load from a row pointer set once per row (32-bit offsets in
the row), all of them issued before the term's math (no load waits behind a branch of the term), four
terms per step into four accumulators; rows whose pointers are not 16-byte aligned, and the last
``n % 4`` terms of a row, take the scalar loop. Stage 2: a work-group per output folds its ``G``
partials in a fixed order (deterministic, no atomics) and applies the epilogue (mean's division, the L2
norm's root, a loss's scale, fused elementwise ops). A work-group folds its items' values with warp
shuffles then across its warps on CUDA, a local-memory tree on OpenCL; always in the same order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch.fx as fx

from kfoundry.plugins.llms.offline.elementwise_ops import fn
from kfoundry.plugins.llms.offline.lower import Val, decompose, horner

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.lower import Lowering

#: At least this many terms per piece; at most about TARGET_GROUPS work-groups in stage 1.
MIN_PIECE = 4096
TARGET_GROUPS = 8192
#: Row mode (innermost reduced dim the loop counter) where that dim has at least this many terms.
ROW_MIN = 256

_COMBINE = {
    "add": ("0.0f", "{a} += {b};"),
    "max": ("-INFINITY", "{a} = ({b} > {a} || {b} != {b}) ? {b} : {a};"),
    "min": ("INFINITY", "{a} = ({b} < {a} || {b} != {b}) ? {b} : {a};"),
}

SPLIT_OPS = ("sum", "mean", "max", "min")

#: The innermost reduced coordinate of the four terms of one float4 step (``kf_j + k``).
LANES = ("kf_e0", "kf_e1", "kf_e2", "kf_e3")

#: float4 steps of a row whose loads are all issued before the first step's math.
STEPS = 2

#: A 16-byte load at a float pointer (CUDA: the pointer 16-byte aligned, checked per row).
_LD4 = {"cuda": "*reinterpret_cast<KF_G const float4*>({p})", "opencl": "vload4(0, {p})"}


def can_split(op: str, p: float) -> bool:
    """Whether :func:`grid_reduce` handles ``op`` (prod, arg-extremes, var, lse are left to the caller)."""
    return op in SPLIT_OPS or (op == "norm" and p in (1.0, 2.0))


def pieces(outs: int, count: int, row: int) -> tuple[int, int]:
    """(pieces per output, rows per piece) of a reduction of ``count`` terms per output for ``outs``
    outputs, a row being ``row`` consecutive terms (1 in flat mode). Mirrors the ``forward`` formula."""
    rows = max(1, count // max(row, 1))
    g = max(1, min(-(-count // MIN_PIECE), -(-TARGET_GROUPS // max(outs, 1))))
    rp = -(-rows // g)
    return -(-rows // rp), rp


@dataclass
class _Quads:
    """Leaf hook of a row step: a float buffer load whose last coordinate is a lane's ``kf_e{k}`` and whose
    other coordinates are ``0`` or plain loop coordinates (row invariant) reads four consecutive elements
    of one row, lane ``k`` the ``k``-th: it becomes ``kf_v{i}.xyzw[k]`` of one float4 load ``kf_v{i}`` per
    (buffer, row). Each one's bounds (every coordinate's range within its dim) are checked in forward
    (``checks``): the loads run unconditionally, also where the term reads them under a guard."""

    #: plain loop coordinate (and each lane's) -> Python expression of its range
    ranges: dict[str, str]
    #: C size (an int argument or a literal) -> its Python expression
    py: Callable[[str], str]
    found: dict[tuple[str, tuple[str, ...]], int] = field(default_factory=dict)
    rows: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    def __call__(self, p: str, c: list[str], dims: list[str], ctype: str) -> str | None:
        head = c[:-1]
        if ctype != "float" or not c or c[-1] not in LANES:
            return None
        if any(x != "0" and (x in LANES or x not in self.ranges) for x in head):
            return None
        key = (p, tuple(head))
        if key not in self.found:
            k = self.found[key] = len(self.found)
            self.rows.append(f"KF_G const float* kf_p{k} = {p} + {horner([*head, '0'], dims)};")
            self.checks += [
                f"{self.py(d)} >= {self.ranges[x]}" for x, d in zip(c, dims, strict=True) if x != "0"
            ]
        return f"kf_v{self.found[key]}[u].{'xyzw'[LANES.index(c[-1])]}"


def _fold(lang: str, comb: str, init: str) -> str:
    """Statements folding every work item's ``s`` in a fixed order: work item 0 ends with the group's
    result in ``s`` (CUDA: shuffles in each warp, then the warps' values by the first warp; OpenCL: a
    local-memory tree over ``kf_r[BLOCK]``)."""
    if lang == "cuda":
        warp = (
            "#pragma unroll\n    for (int o = 16; o > 0; o >>= 1) { const float w = "
            f"__shfl_xor_sync(0xffffffffu, s, o); {comb.format(a='s', b='w')} }}"
        )
        return f"""    {warp}
    if ((t & 31) == 0) kf_r[t >> 5] = s;
    KF_BARRIER;
    if (t < 32) {{
        s = t < BLOCK / 32 ? kf_r[t] : {init};
    {warp}
    }}"""
    return f"""    kf_r[t] = s;
    KF_BARRIER;
    for (int o = BLOCK / 2; o > 0; o >>= 1) {{
        if (t < o) {{ {comb.format(a="kf_r[t]", b="kf_r[t + o]")} }}
        KF_BARRIER;
    }}
    s = kf_r[0];"""


def _scratch(lang: str) -> str:
    return "    KF_LOCAL float kf_r[32];" if lang == "cuda" else "    KF_LOCAL float kf_r[BLOCK];"


def _py_size(L: Lowering) -> Callable[[str], str]:
    by_name = {v: k for k, v in L.syms.items()}
    return lambda c: f"({by_name.get(c, c.strip('()'))})"


@dataclass(frozen=True)
class Fold:
    """One reduction of a :func:`grid_reduce_group`: ``op`` (``p``: a norm's) of ``src``'s terms, its
    output shape variable ``S{tag}``, applying ``node``'s epilogue chain on store (None: no epilogue)."""

    node: fx.Node | None
    src: Val
    op: str
    p: float
    tag: str
    divide_by: str = ""


def _acc_names(n_folds: int) -> Callable[[int, int], str]:
    """The name of fold ``m``'s ``k``-th accumulator (``s0``..``s3`` where the group has one fold)."""
    return (lambda m, k: f"s{k}") if n_folds == 1 else (lambda m, k: f"a{m}_{k}")


def _row_loop(
    L: Lowering,
    folds: list[Fold],
    tag: str,
    ocs: list[str],
    rdims: list[str],
    nrows: str,
    rp: str,
    in_coords: Callable[[list[str], list[str]], list[str]],
) -> str:
    """The piece's rows: the float4 step over each row's first ``n & ~3`` terms where every leaf it reads
    four at a time is 16-byte aligned (:class:`_Quads`: a buffer two folds read is loaded once), the scalar
    loop over the rest of the row; each fold ``m`` into its accumulators ``acc(m, 0..3)``."""
    outer = rdims[:-1]
    rcs = [f"rc{k}" for k in range(len(outer))]
    rdecomp = decompose("rr", outer, rcs, nrows) if outer else ""
    acc = _acc_names(len(folds))
    ops = [_fold_ops(L.lang, f.op, f.p) for f in folds]
    tvs = [f"({term('v')})" for _, _, term in ops]  # each fold's term of the element ``v``
    xs = [f.src.load(in_coords(ocs, [*rcs, "j"])) for f in folds]
    py = _py_size(L)
    ranges = {c: f"S{tag}[{k}]" for k, c in enumerate(ocs)} | {
        c: py(d) for c, d in zip(rcs, outer, strict=True)
    }
    quads = _Quads(ranges | dict.fromkeys(LANES, py(rdims[-1])), py)
    L.leaf_hook = quads
    try:
        lanes = [[f.src.load(in_coords(ocs, [*rcs, e])) for e in LANES] for f in folds]
    finally:
        L.leaf_hook = None
    step = ""
    if quads.found:
        L.fwd(f"V{tag} = int({' and '.join(quads.checks) or 'True'})")
        ld, nq = _LD4[L.lang], len(quads.found)
        loads = " ".join(f"kf_v{k}[u] = {ld.format(p=f'kf_p{k} + kf_i')};" for k in range(nq))
        zero = " ".join(f"kf_v{k}[u] = kf_v{k}[0];" for k in range(nq))
        used = " ".join(
            f"const int {e} = kf_i + {k};"
            for k, e in enumerate(LANES)
            if any(re.search(rf"\b{e}\b", v) for vs in lanes for v in vs)
        )
        terms = "\n                    ".join(
            " ".join(f"{{ const float v = {v}; {comb.format(a=acc(m, k), b=tv)} }}" for k, v in enumerate(vs))
            for m, (vs, (_, comb, _), tv) in enumerate(zip(lanes, ops, tvs, strict=True))
        )
        aligned = " | ".join(f"(size_t)kf_p{k}" for k in range(nq))
        head = "const int kf_i = kf_j + 4 * BLOCK * u; if (u == 0 || kf_i < kf_n4)"
        step = f"""        {" ".join(quads.rows)}
        if ({L.sym(f"V{tag}")} && (({aligned}) & 15) == 0) {{
            for (int kf_j = 4 * t; kf_j < kf_n4; kf_j += 4 * BLOCK * {STEPS}) {{
                float4 {", ".join(f"kf_v{k}[{STEPS}]" for k in range(nq))};
                #pragma unroll
                for (int u = 0; u < {STEPS}; ++u) {{ {head} {{ {loads} }} else {{ {zero} }} }}
                #pragma unroll
                for (int u = 0; u < {STEPS}; ++u) {{ {head} {{ {used}
                    {terms}
                }} }}
            }}
            kf_j0 = kf_n4;
        }}
"""
    tail = " ".join(
        f"{{ const float v = {x}; {comb.format(a=acc(m, 0), b=tv)} }}"
        for m, (x, (_, comb, _), tv) in enumerate(zip(xs, ops, tvs, strict=True))
    )
    if len(folds) == 1:
        tail = tail[2:-2]
    return f"""    const kf_long r0 = piece * (kf_long){rp};
    const kf_long r1 = r0 + (kf_long){rp} < (kf_long){nrows} ? r0 + (kf_long){rp} : (kf_long){nrows};
    const int kf_n = (int){rdims[-1]}, kf_n4 = kf_n & ~3;
    for (kf_long rr = r0; rr < r1; ++rr) {{
{rdecomp}        int kf_j0 = 0;
{step}        #pragma unroll 4
        for (int j = kf_j0 + t; j < kf_n; j += BLOCK) {{ {tail} }}
    }}"""


#: Column mode: at least this many threads over (output, piece) pairs, at least COLUMN_PIECE terms a piece.
COLUMN_THREADS = 1 << 18
COLUMN_PIECE = 32


def _fold_ops(lang: str, op: str, p: float) -> tuple[str, str, Callable[[str], str]]:
    """(initial value, combine statement, per-term map) of a split reduction ``op`` (``p``: a norm's)."""
    init, comb = _COMBINE[op if op in ("max", "min") else "add"]
    if op == "norm":
        return (
            init,
            comb,
            (lambda v: f"({v}) * ({v})") if p == 2.0 else (lambda v: f"{fn('fabs', lang)}({v})"),
        )
    return init, comb, lambda v: v


def _finish(lang: str, op: str, p: float, cnt: str, divide_by: str) -> str:
    """Statements turning the folded ``acc`` into the output: mean's division, the L2 norm's root, a
    further divisor."""
    fin = f" acc = acc / (float)({cnt});" if op == "mean" else ""
    if op == "norm" and p == 2.0:
        fin += f" acc = {fn('sqrt', lang)}(acc);"
    return fin + (f" acc = acc / (float)({divide_by});" if divide_by else "")


def column_reduction(
    L: Lowering,
    src: Val,
    dims: list[int],
    in_coords: Callable[[list[str], list[str]], list[str]],
    out: tuple[int, ...],
) -> bool:
    """Whether a reduction of ``src`` over ``dims`` (to ``out``) runs in column mode
    (:func:`_column_reduce`): the output's innermost dim has more than one element, and every buffer the
    term reads has that output coordinate as its own innermost one (neighbouring threads, neighbouring
    addresses: a column sum of a row-major buffer, or a row sum of a transposed view of one) or does not
    read it (one address for neighbouring threads)."""
    n_out = len(out)
    if n_out == 0 or out[-1] <= 1:
        return False
    ocs = [f"o{k}" for k in range(n_out)]
    rcs = [f"rc{k}" for k in range(len(dims))]
    inner = ocs[-1]
    seen: list[list[str]] = []

    def record(p: str, c: list[str], dims_: list[str], ctype: str) -> None:
        seen.append(list(c))
        return None

    saved, L.leaf_hook = L.leaf_hook, record
    try:
        src.load(in_coords(ocs, rcs))
    finally:
        L.leaf_hook = saved
    mention = re.compile(rf"\b{inner}\b")
    return any(c and c[-1] == inner for c in seen) and all(
        (c and c[-1] == inner and not any(mention.search(x) for x in c[:-1]))
        or not any(mention.search(x) for x in c)
        for c in seen
    )


def _column_reduce(
    L: Lowering,
    node: fx.Node | None,
    src: Val,
    op: str,
    p: float,
    tag: str,
    out: tuple[int, ...],
    rdims: list[str],
    count_py: str,
    in_coords: Callable[[list[str], list[str]], list[str]],
    divide_by: str,
) -> Val:
    """:func:`grid_reduce` where the reduced dims are outer to the innermost output dim (a column sum of a
    row-major buffer): a thread per (output, piece), so neighbouring threads read neighbouring addresses
    (a warp reads one 128-byte line per step, not 32 sectors), each folding its piece's terms in order into
    four accumulators; then a thread per output folds its pieces in order (deterministic, no atomics)."""
    init, comb, term = _fold_ops(L.lang, op, p)
    # W: outputs, terms per output, pieces per output, terms per piece
    L.fwd(f"W{tag}r = (_prod(S{tag}), {count_py})")
    L.fwd(
        f"W{tag}g = max(1, min(_cdiv(W{tag}r[1], {COLUMN_PIECE}), _cdiv({COLUMN_THREADS}, max(1, W{tag}r[0]))))"
    )
    L.fwd(f"W{tag}p = _cdiv(W{tag}r[1], W{tag}g)")
    L.fwd(f"W{tag} = (W{tag}r[0], W{tag}r[1], _cdiv(W{tag}r[1], W{tag}p), W{tag}p)")
    outs, cnt, G, rp = (L.sym(f"W{tag}[{k}]") for k in range(4))
    odims = L.shape_dims(f"S{tag}", out)
    ocs = [f"o{k}" for k in range(len(out))]
    rcs = [f"rc{k}" for k in range(len(rdims))]
    x = src.load(in_coords(ocs, rcs))
    fold_v = "(" + term("v") + ")"
    step = " ".join(
        f"if (q + {k} < q1) {{ const kf_long kf_q{k} = q + {k}; "
        + decompose(f"kf_q{k}", rdims, rcs, cnt).replace("\n", " ").strip()
        + f" const float v = {x}; {comb.format(a=f's{k}', b=fold_v)} }}"
        for k in range(4)
    )
    text = f"""    const kf_long blk = KF_GRP(0), piece = blk % (kf_long){G};
    const kf_long oi = (blk / (kf_long){G}) * BLOCK + KF_LID(0);
    if (oi >= (kf_long){outs}) return;
{decompose("oi", odims, ocs, outs) if out else ""}    float s0 = {init}, s1 = {init}, s2 = {init}, s3 = {init};
    const kf_long q0 = piece * (kf_long){rp};
    const kf_long q1 = q0 + (kf_long){rp} < (kf_long){cnt} ? q0 + (kf_long){rp} : (kf_long){cnt};
    for (kf_long q = q0; q < q1; q += 4) {{
        {step}
    }}
    {comb.format(a="s0", b="s1")} {comb.format(a="s2", b="s3")} {comb.format(a="s0", b="s2")}
    y[piece * (kf_long){outs} + oi] = s0;"""
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty(max(1, W{tag}[0] * W{tag}[2]), dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, _cdiv(W{tag}[0], p['BLOCK']) * W{tag}[2]), 1, 1), block=(p['BLOCK'], 1, 1)"
    parts = L.ptr(L.kernel(text, "float", "", f"{op}cpart", launch_dims=launch))
    L.fwd(L.sched.kernels[-1].launch)
    coords = [f"c{k}" for k in range(len(out))]
    store, ctype, _ = L.epilogue(node, out, coords, "float")
    fin = _finish(L.lang, op, p, cnt, divide_by)
    text = f"""    const kf_long row = KF_GID;
    if (row >= (kf_long){outs}) return;
    float s = {init};
    for (kf_long g = 0; g < (kf_long){G}; ++g) {{ const float v = {parts}[g * (kf_long){outs} + row]; {comb.format(a="s", b="v")} }}
{decompose("row", odims, coords, outs) if out else ""}    float acc = s;{fin}
    y[row] = {store};"""
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty(S{tag}, dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, _cdiv(W{tag}[0], p['BLOCK'])), 1, 1), block=(p['BLOCK'], 1, 1)"
    name = L.kernel(text, ctype, "", op, launch_dims=launch)
    L.fwd(L.sched.kernels[-1].launch)
    return L.buffer_val(name, out, f"S{tag}", ctype)


def grid_reduce(
    L: Lowering,
    node: fx.Node | None,
    src: Val,
    op: str,
    p: float,
    tag: str,
    out: tuple[int, ...],
    rdims: list[str],
    rshape: tuple[int, ...],
    count_py: str,
    row_py: str,
    in_coords: Callable[[list[str], list[str]], list[str]],
    divide_by: str,
    column: bool = False,
) -> Val:
    """``op`` of ``src`` over the reduced coordinates (C sizes ``rdims``, traced ``rshape``) for each output
    of ``out`` (the Python shape ``S{tag}``); ``in_coords(out_coords, red_coords)`` places a term.
    ``column``: the reduced dims are outer to the innermost output dim of a row-major buffer
    (:func:`_column_reduce`)."""
    if column:
        return _column_reduce(L, node, src, op, p, tag, out, rdims, count_py, in_coords, divide_by)
    fold = Fold(node, src, op, p, tag, divide_by)
    return grid_reduce_group(L, [fold], out, rdims, rshape, count_py, row_py, in_coords)[0]


def grid_reduce_group(
    L: Lowering,
    folds: list[Fold],
    out: tuple[int, ...],
    rdims: list[str],
    rshape: tuple[int, ...],
    count_py: str,
    row_py: str,
    in_coords: Callable[[list[str], list[str]], list[str]],
) -> list[Val]:
    """:func:`grid_reduce` of several folds over one iteration space (sibling reductions: every source
    of the same shape, reduced over the same dims) in ONE first-stage kernel: a piece's terms are read
    once for all folds (a buffer two folds read, once), each fold into its own accumulators and its own
    slice of the partials; then each fold's second stage. The sizes are the first fold's (its ``tag``)."""
    tag = folds[0].tag
    row_mode = len(rshape) >= 1 and rshape[-1] >= ROW_MIN
    rowlen_py = row_py if row_mode else "1"
    # W: outputs, terms per output, rows per output, pieces per output, rows per piece
    L.fwd(f"W{tag}r = (_prod(S{tag}), {count_py}, max(1, ({count_py}) // max(1, {rowlen_py})))")
    L.fwd(
        f"W{tag}g = max(1, min(_cdiv(W{tag}r[1], {MIN_PIECE}), _cdiv({TARGET_GROUPS}, max(1, W{tag}r[0]))))"
    )
    L.fwd(
        f"W{tag} = (W{tag}r[0], W{tag}r[1], W{tag}r[2], _cdiv(W{tag}r[2], _cdiv(W{tag}r[2], W{tag}g)), "
        f"_cdiv(W{tag}r[2], W{tag}g))"
    )
    outs, cnt, nrows, G, rp = (L.sym(f"W{tag}[{k}]") for k in range(5))
    odims = L.shape_dims(f"S{tag}", out)
    ocs = [f"o{k}" for k in range(len(out))]
    odecomp = decompose("oi", odims, ocs, outs) if out else ""
    acc = _acc_names(len(folds))
    ops = [_fold_ops(L.lang, f.op, f.p) for f in folds]
    if row_mode:
        loop = _row_loop(L, folds, tag, ocs, rdims, nrows, rp, in_coords)
    else:
        rcs = [f"rc{k}" for k in range(len(rdims))]
        rdecomp = decompose("q", rdims, rcs, cnt) if rdims else ""
        tvs = [f"({term('v')})" for _, _, term in ops]
        terms = " ".join(
            f"{{ const float v = {f.src.load(in_coords(ocs, rcs))}; {comb.format(a=acc(m, 0), b=tv)} }}"
            for m, (f, (_, comb, _), tv) in enumerate(zip(folds, ops, tvs, strict=True))
        )
        loop = f"""    const kf_long q0 = piece * (kf_long){rp};
    const kf_long q1 = q0 + (kf_long){rp} < (kf_long){cnt} ? q0 + (kf_long){rp} : (kf_long){cnt};
    for (kf_long q = q0 + t; q < q1; q += BLOCK) {{
{rdecomp}        {terms[2:-2] if len(folds) == 1 else terms}
    }}"""
    heads, finals = [], []
    for m, (init, comb, _) in enumerate(ops):
        a = [acc(m, k) for k in range(4)]
        heads.append(f"    float {', '.join(f'{x} = {init}' for x in a)};")
        merge = f"{comb.format(a=a[0], b=a[1])} {comb.format(a=a[2], b=a[3])} {comb.format(a=a[0], b=a[2])}"
        at = "blk" if m == 0 else f"(kf_long){m} * ({outs} * (kf_long){G}) + blk"
        finals.append(
            f"""    {merge}
    float s = {a[0]};
{_fold(L.lang, comb, init)}
    if (t == 0) y[{at}] = s;"""
            if len(folds) == 1
            else f"""    {{
    {merge}
    float s = {a[0]};
{_fold(L.lang, comb, init)}
    if (t == 0) y[{at}] = s;
    }}
    KF_BARRIER;"""
        )
    heads_text, finals_text = "\n".join(heads), "\n".join(finals)
    text = f"""{_scratch(L.lang)}
    const int t = KF_LID(0);
    const kf_long blk = KF_GRP(0), oi = blk / (kf_long){G}, piece = blk - oi * (kf_long){G};
{odecomp}{heads_text}
{loop}
{finals_text}"""
    n = len(folds)
    idx = L.nk
    times = f"{n} * " if n > 1 else ""
    L.fwd(f"b{idx} = torch.empty(max(1, {times}W{tag}[0] * W{tag}[3]), dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, W{tag}[0] * W{tag}[3]), 1, 1), block=(p['BLOCK'], 1, 1)"
    what = folds[0].op if n == 1 else "group"
    parts = L.ptr(L.kernel(text, "float", "", f"{what}gpart", launch_dims=launch))
    L.fwd(L.sched.kernels[-1].launch)
    return [_final_stage(L, f, m, parts, tag, out, odims, (outs, cnt, G)) for m, f in enumerate(folds)]


def _final_stage(
    L: Lowering,
    fold: Fold,
    m: int,
    parts: str,
    wtag: str,
    out: tuple[int, ...],
    odims: list[str],
    sizes: tuple[str, str, str],
) -> Val:
    """Fold ``m``'s second stage: a work-group per output folds its ``G`` partials (slice ``m`` of
    ``parts``) in a fixed order and applies the finish and the epilogue (``sizes``: the C outputs, terms
    per output and pieces per output of the group's sizes ``W{wtag}``)."""
    outs, cnt, G = sizes
    init, comb, _ = _fold_ops(L.lang, fold.op, fold.p)
    coords = [f"c{k}" for k in range(len(out))]
    store, ctype, _ = L.epilogue(fold.node, out, coords, "float")
    decomp = decompose("row", odims, coords, outs) if out else ""
    fin = _finish(L.lang, fold.op, fold.p, cnt, fold.divide_by)
    base = f"{parts} + row * (kf_long){G}" + (f" + (kf_long){m} * ({outs} * (kf_long){G})" if m else "")
    text = f"""{_scratch(L.lang)}
    const int t = KF_LID(0);
    const kf_long row = KF_GRP(0);
    float s = {init};
    KF_G const float* kf_pp = {base};
    #pragma unroll 8
    for (int i = t; i < {G}; i += BLOCK) {{ const float v = kf_pp[i]; {comb.format(a="s", b="v")} }}
{_fold(L.lang, comb, init)}
    if (t == 0) {{
{decomp}        float acc = s;{fin}
        y[row] = {store};
    }}"""
    idx = L.nk
    L.fwd(f"b{idx} = torch.empty(S{fold.tag}, dtype=torch.float32, device=dev)")
    launch = f"grid=(max(1, W{wtag}[0]), 1, 1), block=(p['BLOCK'], 1, 1)"
    name = L.kernel(text, ctype, "", fold.op, launch_dims=launch)
    L.fwd(L.sched.kernels[-1].launch)
    return L.buffer_val(name, out, f"S{fold.tag}", ctype)


def online_lse(head: str, x: Callable[[str], str], var: str, lanes: bool, exp: str, log: str) -> str:
    """``float acc`` = logsumexp of ``x(var)`` over the loop ``head`` in ONE read: a running max ``mx`` and
    a sum rescaled when the max grows (NaN propagates, -inf terms add nothing, an infinite max is the
    result); with ``lanes`` the lanes' (max, sum) pairs merge across the warp."""
    step = (
        f"{{ const float v = {x(var)}; if (v > mx || v != v) {{ acc = (v != v) ? v : acc * {exp}(mx - v) + 1.0f; "
        f"mx = v; }} else if (v != -INFINITY) acc += {exp}(v - mx); }}"
    )
    merge = (
        " { const float mw = kf_wmax(mx); acc = mx == -INFINITY ? 0.0f : (mx == mw ? acc : acc * "
        f"{exp}(mx - mw)); acc = kf_wsum(acc); mx = mw; }}"
        if lanes
        else ""
    )
    return (
        f"float mx = -INFINITY, acc = 0.0f; {head} {step}{merge}\n"
        f"        acc = (mx == INFINITY || mx == -INFINITY) ? mx : mx + {log}(acc);"
    )


def fused_sums(
    q: str, count: str, pre: str, sums: list[tuple[str, str]], lanes: bool, chunk: int, unroll: str
) -> str:
    """``float`` accumulators ``name`` = the sums of ``term`` over ``q`` < count for each (name, term) of
    ``sums`` in ONE loop (``pre`` declares the values the terms share: each input read once), one partial
    per ``chunk`` terms (per lane with ``lanes``, the warp's totals in every lane)."""
    span = 32 * chunk if lanes else chunk
    start, step = (f"{q}0 + kf_lane", "32") if lanes else (f"{q}0", "1")
    decl = " ".join(f"float {a} = 0.0f;" for a, _ in sums)
    parts = " ".join(f"float {a}_p = 0.0f;" for a, _ in sums)
    adds = " ".join(f"{a}_p += {t};" for a, t in sums)
    fold = " ".join(f"{a} += {a}_p;" for a, _ in sums)
    warp = " ".join(f"{a} = kf_wsum({a});" for a, _ in sums) if lanes else ""
    return (
        f"{decl}\n"
        f"        for (kf_long {q}0 = 0; {q}0 < (kf_long)({count}); {q}0 += {span}) {{\n"
        f"            {parts}\n"
        f"            const kf_long {q}_end = {q}0 + {span} < (kf_long)({count}) ? {q}0 + {span} : (kf_long)({count});\n"
        f"            {unroll} for (kf_long {q} = {start}; {q} < {q}_end; {q} += {step}) {{ {pre} {adds} }}\n"
        f"            {fold}\n        }}\n        {warp}"
    )
