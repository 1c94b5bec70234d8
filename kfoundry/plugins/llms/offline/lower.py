"""Lower a traced KernelBench reference into a schedule of kernels built from op recipes.

Every fx node becomes a :class:`Val`: a loader (C expression of the value at given coordinates) over
symbolic sizes. Views (reshape, permute, slicing, flip, cat...) and, in the fused schedule, every
elementwise op stay loaders, so they are evaluated inside the kernel that reads them (prologue
fusion); an elementwise chain that only consumes one anchor's output is applied where that anchor
stores (epilogue fusion). Anchors (matmul, convolution, pooling, reductions, scans, norms, losses,
attention; :mod:`.lower_ops`) are kernels writing a buffer. Sizes reach the kernels as arguments,
computed in ``forward`` from the inputs' shapes, so one build serves every shape.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from kfoundry.core.generator import GeneratorUnsupported
from kfoundry.core.kernelbench_file import split_assignments
from kfoundry.plugins.llms.offline.cookbook_elementwise import KF_FAST, fast_expr
from kfoundry.plugins.llms.offline.elementwise_ops import lit, node_expr, prelude

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline import lower_group

Loader = Callable[[list[str]], str]

#: In a matrix product's K bound: one past the last output row of the block's tile (each schedule
#: substitutes its own tile rows)
TILE_END = "KF_TILE_END"

KERNEL_HEADER = {
    "opencl": """#define KF_KERNEL __kernel void
#define KF_G __global
#define KF_R restrict
typedef long kf_long;
typedef uchar kf_bool;
#define KF_GID ((kf_long)get_global_id(0))
#define KF_GSTRIDE ((kf_long)get_global_size(0))
#define KF_LOCAL __local
#define KF_BARRIER barrier(CLK_LOCAL_MEM_FENCE)
#define KF_LID(d) ((int)get_local_id(d))
#define KF_GRP(d) ((kf_long)get_group_id(d))
#define KF_STORE4(p, i, a, b, c, d) vstore4((float4)((a), (b), (c), (d)), 0, (p) + (i))
#ifndef TILE
#define TILE 16
#endif
""",
    "cuda": """#define KF_KERNEL extern "C" __global__ void
#define KF_G
#define KF_R __restrict__
typedef long long kf_long;
typedef unsigned char kf_bool;
#define KF_GID ((kf_long)blockIdx.x * blockDim.x + threadIdx.x)
#define KF_GSTRIDE ((kf_long)gridDim.x * blockDim.x)
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#define KF_LOCAL __shared__
#define KF_BARRIER __syncthreads()
#define KF_LID(d) ((int)((d) == 0 ? threadIdx.x : (d) == 1 ? threadIdx.y : threadIdx.z))
#define KF_GRP(d) ((kf_long)((d) == 0 ? blockIdx.x : (d) == 1 ? blockIdx.y : blockIdx.z))
#define KF_STORE4(p, i, a, b, c, d) (*reinterpret_cast<float4*>((p) + (i)) = make_float4((a), (b), (c), (d)))
#ifndef TILE
#define TILE 16
#endif
""",
}

#: Helpers of the cooperative schedule: warp all-reductions (every lane gets the result; max/min
#: propagate NaN as torch does; arg-max/min keep the first index of the extreme or of the first NaN).
#: On CUDA they are register shuffles. On OpenCL (a test of the schedule's logic on PoCL, run with
#: 32-item work-groups so that a work-group is one "warp") they go through local memory.
COOP_HEADER = {
    "cuda": """#define KF_WARP_ALL 0xffffffffu
#define KF_NOIDX 0x7fffffffffffffffLL
#define KF_LANE ((int)(threadIdx.x & 31))
#define KF_COOP_SCRATCH
#define KF_ALIGN16 __align__(16)
#define KF_LD4(p) (*reinterpret_cast<const float4*>(p))
#define KF_LD2(p) (*reinterpret_cast<const float2*>(p))
#define KF_FMA(a, b, c) fmaf((a), (b), (c))
__device__ __forceinline__ float kf_wsum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(KF_WARP_ALL, v, o);
    return v;
}
__device__ __forceinline__ float kf_wprod(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v *= __shfl_xor_sync(KF_WARP_ALL, v, o);
    return v;
}
__device__ __forceinline__ float kf_wmax(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(KF_WARP_ALL, v, o); v = (w > v || w != w) ? w : v; }
    return v;
}
__device__ __forceinline__ float kf_wmin(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(KF_WARP_ALL, v, o); v = (w < v || w != w) ? w : v; }
    return v;
}
__device__ __forceinline__ float kf_wscan_add(float v) {
    const int lane = (int)(threadIdx.x & 31);
    #pragma unroll
    for (int o = 1; o < 32; o <<= 1) { const float t = __shfl_up_sync(KF_WARP_ALL, v, o); if (lane >= o) v += t; }
    return v;
}
__device__ __forceinline__ float kf_wscan_mul(float v) {
    const int lane = (int)(threadIdx.x & 31);
    #pragma unroll
    for (int o = 1; o < 32; o <<= 1) { const float t = __shfl_up_sync(KF_WARP_ALL, v, o); if (lane >= o) v *= t; }
    return v;
}
__device__ __forceinline__ float kf_wlast(float v) { return __shfl_sync(KF_WARP_ALL, v, 31); }
__device__ __forceinline__ kf_long kf_warg(float b, kf_long i, int want_max) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(KF_WARP_ALL, b, o);
        const kf_long oi = __shfl_xor_sync(KF_WARP_ALL, i, o);
        const bool bn = b != b, on = ob != ob;
        const bool take = on ? (!bn || oi < i)
                             : (!bn && (want_max ? ob > b : ob < b)) || (!bn && ob == b && oi < i);
        if (take) { b = ob; i = oi; }
    }
    return i;
}
""",
    "opencl": """#define KF_NOIDX 0x7fffffffffffffffL
#define KF_LANE ((int)(get_local_id(0) & 31))
#define KF_COOP_SCRATCH __local float kf_shf[BLOCK]; __local kf_long kf_shl[BLOCK];
#define KF_ALIGN16
#define KF_LD4(p) vload4(0, (p))
#define KF_LD2(p) vload2(0, (p))
#define KF_FMA(a, b, c) ((a) * (b) + (c))
#define KF_WBASE ((int)get_local_id(0) & ~31)
float kf_wop(float v, __local float* sh, int op) {
    barrier(CLK_LOCAL_MEM_FENCE);
    sh[get_local_id(0)] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float r = sh[KF_WBASE];
    for (int k = 1; k < 32; ++k) {
        const float w = sh[KF_WBASE + k];
        if (op == 0) r += w;
        else if (op == 1) r *= w;
        else if (op == 2) r = (w > r || w != w) ? w : r;
        else r = (w < r || w != w) ? w : r;
    }
    return r;
}
kf_long kf_warg_(float b, kf_long i, int want_max, __local float* shf, __local kf_long* shl) {
    barrier(CLK_LOCAL_MEM_FENCE);
    shf[get_local_id(0)] = b;
    shl[get_local_id(0)] = i;
    barrier(CLK_LOCAL_MEM_FENCE);
    b = shf[KF_WBASE];
    i = shl[KF_WBASE];
    for (int k = 1; k < 32; ++k) {
        const float ob = shf[KF_WBASE + k];
        const kf_long oi = shl[KF_WBASE + k];
        const int bn = b != b, on = ob != ob;
        const int take = on ? (!bn || oi < i) : (!bn && (want_max ? ob > b : ob < b)) || (!bn && ob == b && oi < i);
        if (take) { b = ob; i = oi; }
    }
    return i;
}
float kf_wscan_(float v, __local float* sh, int mul) {
    barrier(CLK_LOCAL_MEM_FENCE);
    sh[get_local_id(0)] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    float r = sh[KF_WBASE];
    for (int k = 1; k <= (int)(get_local_id(0) & 31); ++k) r = mul ? r * sh[KF_WBASE + k] : r + sh[KF_WBASE + k];
    return r;
}
float kf_wlast_(float v, __local float* sh) {
    barrier(CLK_LOCAL_MEM_FENCE);
    sh[get_local_id(0)] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    return sh[KF_WBASE + 31];
}
#define kf_wscan_add(v) kf_wscan_((v), kf_shf, 0)
#define kf_wscan_mul(v) kf_wscan_((v), kf_shf, 1)
#define kf_wlast(v) kf_wlast_((v), kf_shf)
#define kf_wsum(v) kf_wop((v), kf_shf, 0)
#define kf_wprod(v) kf_wop((v), kf_shf, 1)
#define kf_wmax(v) kf_wop((v), kf_shf, 2)
#define kf_wmin(v) kf_wop((v), kf_shf, 3)
#define kf_warg(b, i, m) kf_warg_((b), (i), (m), kf_shf, kf_shl)
""",
}

COOP_COMMON = """#ifndef ILP
#define ILP 1
#endif
#ifndef RB
#define RB 4
#endif
#if RB % 2 != 0
#error "RB must be even"
#endif
#ifndef KF_SU
#define KF_SU 4
#endif
"""

#: Cooperative schedule: loops of at least this many (traced) terms run across a warp's 32 lanes.
LANE_MIN = 64

#: ... unless the loop strides a dimension that is not its input's innermost and there are at least this
#: many outputs: then a thread per output. A warp's 32 lanes on one output read 32 sectors per load (a
#: sector each, 1/8 of it used) where 32 threads on neighbouring outputs read one 128-byte line; 2**16
#: threads are 16 warps on each of an H200's 132 SMs (a quarter of its 2048 threads a SM), each with four
#: loads of its loop in flight: a few MB in flight, what DRAM's latency-bandwidth product asks.
STRIDED_OUT_MIN = 1 << 16

#: Quads a thread of a pointwise kernel takes per grid-stride step (:meth:`Lowering._quads`) where the
#: parameters lack QU: their 16-byte loads in flight together. One: on an H100 (session 14, call 3,
#: ``--sweep QU``) QU 2 and 4 were no faster (leaky_relu_broadcast_bias 4.54 / 4.58 / 4.67 ms at QU 1 / 2 / 4,
#: matrix_scalar_multiplication 3.01 / 2.99-3.45 / 3.02); QU stays in the CUDA graph recipes' space.
QU_DEFAULT = {"cuda": 1, "opencl": 1}


def strided(shape: tuple[int, ...], dims: Sequence[int]) -> bool:
    """Whether a loop over ``dims`` of a row-major ``shape`` strides memory: the innermost dim of more
    than one element is not among them (one output's terms lie at least that dim's size apart)."""
    inner = max((k for k, v in enumerate(shape) if v > 1), default=len(shape) - 1)
    return inner not in dims


#: Python helpers of the rendered module (shape rules evaluated in ``forward``).
PY_HELPERS = '''
import math

_KF_SEED = [0x2545F491]


def _kf_seed(n):
    # dropout's seed: a new one per call (a linear congruential step), mixed with the node number
    _KF_SEED[0] = (_KF_SEED[0] * 1103515245 + 12345) & 0x3FFFFFFF
    return _KF_SEED[0] ^ n


def _grid(n, b):
    return (max(1, min(_cdiv(int(n), b), 8192)), 1, 1)


def _nt(v, nd):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd


def _bshape(*shapes):
    nd = max(len(s) for s in shapes)
    out = []
    for k in range(nd):
        sizes = [s[len(s) - nd + k] for s in shapes if len(s) - nd + k >= 0]
        out.append(max(sizes) if all(v == 1 or v == max(sizes) for v in sizes) else -1)
    return tuple(out)


def _rshape(s, dims, keep):
    return tuple((1 if k in dims else v) for k, v in enumerate(s) if keep or k not in dims)


def _reshape(s, args):
    args = list(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else list(args)
    if -1 in args:
        known = _prod(a for a in args if a != -1)
        args[args.index(-1)] = _prod(s) // max(known, 1)
    return tuple(args)


def _norm_index(s, idx):
    """(output shape, per output dim: (input dim or None), per input dim: (start, step) or fixed index)."""
    idx = list(idx) if isinstance(idx, tuple) else [idx]
    if Ellipsis in idx:
        k = idx.index(Ellipsis)
        fill = len(s) - sum(1 for i in idx if i is not None and i is not Ellipsis)
        idx = idx[:k] + [slice(None)] * fill + idx[k + 1:]
    idx += [slice(None)] * (len(s) - sum(1 for i in idx if i is not None))
    out, start, step, d = [], [], [], 0
    for i in idx:
        if i is None:
            out.append(1)
            continue
        if isinstance(i, slice):
            a, b, c = i.indices(s[d])
            out.append(max(0, (b - a + (c - 1)) // c))
            start.append(a)
            step.append(c)
        else:
            start.append(i % s[d])
            step.append(0)
        d += 1
    return tuple(out), tuple(start), tuple(step)


def _mmshape(a, b):
    a1, b1 = len(a) == 1, len(b) == 1
    a2 = (1,) + tuple(a) if a1 else tuple(a)
    b2 = tuple(b) + (1,) if b1 else tuple(b)
    out = _bshape(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if a1:
        out = out[:-2] + out[-1:]
    if b1:
        out = out[:-1]
    return out


def _convshape(s, w, stride, pad, dil):
    nd = len(s) - 2
    st, pd, dl = _nt(stride, nd), _nt(pad, nd), _nt(dil, nd)
    sp = tuple((s[2 + k] + 2 * pd[k] - dl[k] * (w[2 + k] - 1) - 1) // st[k] + 1 for k in range(nd))
    return (s[0], w[0]) + sp


def _convtshape(s, w, groups, stride, pad, dil, opad):
    nd = len(s) - 2
    st, pd, dl, op = _nt(stride, nd), _nt(pad, nd), _nt(dil, nd), _nt(opad, nd)
    sp = tuple((s[2 + k] - 1) * st[k] - 2 * pd[k] + dl[k] * (w[2 + k] - 1) + op[k] + 1 for k in range(nd))
    return (s[0], w[1] * groups) + sp


def _poolsize(n, k, s, p, d, ceil):
    num = n + 2 * p - d * (k - 1) - 1
    out = (-(-num // s) if ceil else num // s) + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    return out


def _poolshape(s, nd, k, st, p, d, ceil):
    k, st, p, d = _nt(k, nd), _nt(st if st else k, nd), _nt(p, nd), _nt(d, nd)
    lead = tuple(s[: len(s) - nd])
    return lead + tuple(_poolsize(s[len(s) - nd + i], k[i], st[i], p[i], d[i], ceil) for i in range(nd))
'''


@dataclass
class Val:
    """A tensor value of the traced graph: its traced shape, symbolic dims (C names) and loader."""

    shape: tuple[int, ...]
    dims: list[str]
    load: Loader
    py_shape: str
    ctype: str = "float"
    #: Python name of the buffer holding this value contiguously (views of it keep it when order is kept).
    buffer: str | None = None
    #: Elementwise (no anchor between it and its operands): may be applied in an anchor's epilogue.
    elementwise_node: fx.Node | None = None
    #: A view whose last two dims are its source's swapped (``.T``, ``transpose(-2, -1)``): as a matrix
    #: product's B operand, its rows run along K (``lintile``'s layout).
    swapped_last: bool = False


@dataclass
class PyVal:
    """A Python value of the trace (a size, a shape, a constant)."""

    value: Any
    expr: str
    #: C name of the float kernel argument carrying it (a number passed to ``forward``), else baked.
    cname: str = ""


@dataclass
class Kernel:
    name: str
    source: str
    launch: str


@dataclass
class Schedule:
    kernels: list[Kernel] = field(default_factory=list)
    forward: list[str] = field(default_factory=list)
    output: str = ""
    n_inputs: int = 0
    #: sources appended after every kernel (their macros reach no graph kernel): :mod:`.lower_mm_direct`
    tail: list[str] = field(default_factory=list)


@dataclass
class LetScope:
    """Temporaries of one statement: ``const float kf_tN = ...;`` lines, and (node, coords) -> name."""

    stmts: list[str] = field(default_factory=list)
    memo: dict[Any, str] = field(default_factory=dict)  # (node, coords) or a guarded tree's text

    def text(self, indent: str = " " * 12) -> str:
        return "".join(f"{st}\n{indent}" for st in self.stmts)


#: C constructs that evaluate an operand conditionally: loads under them must not be hoisted.
_GUARDED = re.compile(r"\?|&&|\|\|")


def horner(coords: list[str], dims: list[str]) -> str:
    """Row-major flat index of ``coords`` over ``dims``."""
    if not coords:
        return "0"
    out = f"({coords[0]})"
    for c, d in zip(coords[1:], dims[1:], strict=True):
        out = f"({out} * {d} + ({c}))"
    return out


def unflat(flat: str, dims: list[str]) -> list[str]:
    """Coordinates of the row-major ``flat`` index over ``dims``."""
    out = []
    for k in range(len(dims)):
        tail = " * ".join(dims[k + 1 :])
        q = f"(({flat}) / ((kf_long){tail}))" if tail else f"({flat})"
        out.append(f"({q} % {dims[k]})" if k > 0 else q)
    return out


def decompose(flat: str, dims: list[str], names: list[str], total: str) -> str:
    """C statements declaring ``names`` (kf_long) as the row-major coordinates of ``flat`` over ``dims``:
    in unsigned 32-bit arithmetic where ``total`` (the index space) fits, 64-bit otherwise (a 64-bit
    division is a long software routine; a 32-bit one a few instructions)."""
    if not dims:
        return ""
    if len(dims) == 1:
        return f"        const kf_long {names[0]} = {flat};\n"
    wide = unflat(flat, dims)
    narrow = []
    for k in range(len(dims)):
        tail = dims[k + 1 :]
        q = f"((unsigned)({flat}) / ((unsigned){' * '.join(tail)}))" if tail else f"((unsigned)({flat}))"
        narrow.append(f"({q} % (unsigned){dims[k]})" if k > 0 else q)
    decl = "".join(f"        kf_long {n};\n" for n in names)
    small = " ".join(f"{n} = (kf_long)({e});" for n, e in zip(names, narrow, strict=True))
    big = " ".join(f"{n} = {e};" for n, e in zip(names, wide, strict=True))
    return f"{decl}        if ({total} <= (kf_long)0x7fffffff) {{ {small} }} else {{ {big} }}\n"


class Lowering:
    """Lower one traced graph to a :class:`Schedule` in ``lang`` (``fuse``: inline elementwise ops)."""

    def __init__(self, gm: fx.GraphModule, lang: str, fuse: bool, coop: bool = False) -> None:
        self.gm = gm
        self.lang = lang
        self.fuse = fuse
        #: the cooperative schedule (CUDA): long reductions a warp per output, ILP elements per thread
        #: elsewhere, matrix products register-blocked
        self.coop = coop
        #: set when a body being built loops across the lanes of a warp (its kernel becomes warp-per-item)
        self.lanes_used = False
        #: (output elements per matrix, batch) of each register-blocked product (the recipe sizes RB from them)
        self.mm_sizes: list[tuple[int, int]] = []
        #: the variants (with a bias or not) of sgemm_warp's kernels in the source (:mod:`.lower_mm_direct`)
        self.direct_mm: set[bool] = set()
        #: (output channels per group, output positions, images x groups) of each implicit-GEMM convolution
        self.conv_sizes: list[tuple[int, int, int]] = []
        #: node -> Val, PyVal, or a pending (values, indices) pair of torch.max/min (``lower_ops._Pending``)
        self.vals: dict[fx.Node, Any] = {}
        self.syms: dict[str, str] = {}  # python expr -> C name
        self.fsyms: dict[str, str] = {}  # python expr -> C name of a float argument
        self.n_placeholders = 0
        #: keyword arguments a module call stands for (a loss module's reduction, beta...)
        self.module_kwargs: dict[fx.Node, dict[str, Any]] = {}
        self.has_dev = False
        self.ptrs: dict[str, tuple[str, str]] = {}  # C name -> (python expr, ctype)
        self.sched = Schedule()
        self.users: dict[fx.Node, list[fx.Node]] = {n: list(n.users) for n in gm.graph.nodes}
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.fused_into: dict[fx.Node, fx.Node] = {}
        #: anchors whose kernel applied their epilogue chain
        self.applied: set[fx.Node] = set()
        self.nk = 0
        self.nloop = 0
        #: let scopes of the expression being built (:meth:`bound_load`); None: inline as a tree
        self.let_stack: list[LetScope | None] = []
        self.ntemp = 0
        #: while set, a buffer's load asks it first: (C pointer, coords, C dims, ctype) -> its own expression
        #: of the load, or None for the plain one (``lower_split``'s float4 leaves)
        self.leaf_hook: Callable[[str, list[str], list[str], str], str | None] | None = None
        #: sibling reductions held for one shared kernel (:mod:`.lower_group`), emitted before the next
        #: kernel, the next ``forward`` line naming one of them, or the output
        self.pending: list[lower_group.Pending] = []
        self.flushes = 0

    # -- symbols --------------------------------------------------------------------------------

    def sym(self, py: str) -> str:
        """C name of the int kernel argument whose value ``forward`` computes as ``py``."""
        py = py.strip()
        if re.fullmatch(r"-?\d+", py):
            return py if not py.startswith("-") else f"({py})"
        if py not in self.syms:
            self.syms[py] = f"z{len(self.syms)}"
        return self.syms[py]

    def fsym(self, py: str) -> str:
        """C name of the float kernel argument whose value ``forward`` computes as ``py``."""
        if py not in self.fsyms:
            self.fsyms[py] = f"f{len(self.fsyms)}"
        return self.fsyms[py]

    def ptr(self, py: str, ctype: str = "float") -> str:
        for name, (expr, _) in self.ptrs.items():
            if expr == py:
                return name
        name = f"buf{len(self.ptrs)}"
        self.ptrs[name] = (py, ctype)
        return name

    def lanes(self, n: int | None, shape: tuple[int, ...] | None = None, dims: Sequence[int] = ()) -> bool:
        """Whether a loop of ``n`` (traced) terms runs across the 32 lanes of a warp (``kf_lane``); given
        the loop's input ``shape`` (row-major) and the ``dims`` it runs over: never where they stride
        memory (:func:`strided`) and the outputs alone fill the GPU (:data:`STRIDED_OUT_MIN`: a thread
        each, neighbours on neighbouring addresses)."""
        if shape is not None and strided(shape, dims):
            outputs = math.prod(v for k, v in enumerate(shape) if k not in dims)
            if outputs >= STRIDED_OUT_MIN:
                return False
        use = self.coop and n is not None and n >= LANE_MIN
        self.lanes_used |= use
        return use

    def fresh(self, base: str = "i") -> str:
        self.nloop += 1
        return f"{base}{self.nloop}"

    def shape_dims(self, py_shape: str, shape: tuple[int, ...]) -> list[str]:
        return [self.sym(f"{py_shape}[{k}]") for k in range(len(shape))]

    def buffer_val(self, py: str, shape: tuple[int, ...], py_shape: str, ctype: str = "float") -> Val:
        dims = self.shape_dims(py_shape, shape)
        p = self.ptr(py, ctype)

        def load(c: list[str]) -> str:
            got = self.leaf_hook(p, c, dims, ctype) if self.leaf_hook is not None else None
            return got if got is not None else f"{p}[{horner(c, dims)}]"

        return Val(shape, dims, load, py_shape, ctype, buffer=py)

    def fwd(self, line: str) -> None:
        if self.pending and any(re.search(rf"\b{q.alias}\b", line) for q in self.pending):
            _flush(self)
        self.sched.forward.append(line)

    # -- kernels --------------------------------------------------------------------------------

    def kernel(self, body: str, out_ctype: str, work_py: str, tag: str, launch_dims: str = "") -> str:
        """Add a kernel over ``work_py`` work items; returns the Python name of its output buffer ``y``."""
        if self.pending:
            _flush(self)
        name = f"k{self.nk}_{tag}"
        self.nk += 1
        used_ptrs = [p for p in self.ptrs if re.search(rf"\b{p}\b", body)]
        used_syms = sorted(
            {s for s in self.syms.values() if re.search(rf"\b{s}\b", body)}, key=lambda s: int(s[1:])
        )
        by_name = {v: k for k, v in self.syms.items()}
        args = [f"KF_G const {self.ptrs[p][1]}* KF_R {p}" for p in used_ptrs]
        args.append(f"KF_G {out_ctype}* KF_R y")
        args += [f"int {s}" for s in used_syms]
        used_f = [(py, c) for py, c in self.fsyms.items() if re.search(rf"\b{c}\b", body)]
        args += [f"float {c}" for _, c in used_f]
        src = f"KF_KERNEL {name}({', '.join(args)}) {{\n{body}\n}}\n"
        out = f"b{name.split('_')[0][1:]}"
        py_args = [self.ptrs[p][0] for p in used_ptrs] + [out] + [f"int({by_name[s]})" for s in used_syms]
        py_args += [f"float({py})" for py, _ in used_f]
        dims = launch_dims or f"grid=_grid({work_py}, p['BLOCK']), block=(p['BLOCK'], 1, 1)"
        launch = f"self.prog.{name}({', '.join(py_args)}, {dims})"
        self.sched.kernels.append(Kernel(name, src, launch))
        return out

    def emit_pointwise(
        self,
        out: tuple[int, ...],
        py_shape: str,
        body: Callable[[list[str]], str],
        tag: str,
        ctype: str = "float",
        node: fx.Node | None = None,
    ) -> Val:
        """A kernel with one work item per output element; ``body(coords)`` sets ``acc``."""
        dims = self.shape_dims(py_shape, out)
        coords = [f"c{k}" for k in range(len(out))]
        total = " * ".join(f"(kf_long){d}" for d in dims) or "1"
        decomp = decompose("g", dims, [f"c{k}" for k in range(len(out))], "total")
        store, final_ctype, _ = self.epilogue(node, out, coords, ctype)
        self.lanes_used = False
        inner = body(coords)
        work = f"_prod({py_shape})"
        looped = re.search(r"\b(for|while)\b", inner) is not None
        if self.lanes_used:  # a warp per output element: lanes share its loops, lane 0 stores
            text = (
                f"    KF_COOP_SCRATCH\n    const kf_long total = {total};\n    const int kf_lane = KF_LANE;\n"
                f"    for (kf_long g = KF_GID >> 5; g < total; g += KF_GSTRIDE >> 5) {{\n{decomp}"
                f"        {inner}\n        if (kf_lane == 0) y[g] = {store};\n    }}"
            )
            return self.finish(text, final_ctype, py_shape, out, tag, f"32 * {work}")
        if self.fuse and final_ctype == "float" and coords and not looped:
            # a work item per QU quads of four consecutive elements (QU_DEFAULT where the parameters lack it)
            quads = f"_cdiv({work}, 4 * p.get('QU', {QU_DEFAULT.get(self.lang, 1)}))"
            vec = self._quad_loads(coords, body, py_shape)
            text = self._quads(dims, coords, inner, store, total, vec)
            return self.finish(text, final_ctype, py_shape, out, tag, quads)
        if self.coop and not looped:  # ILP elements per thread, a grid-stride apart (loads in flight)
            text = (
                f"    const kf_long total = {total};\n"
                f"    for (kf_long g0 = KF_GID; g0 < total; g0 += ILP * KF_GSTRIDE) {{\n"
                "    #pragma unroll\n    for (int u = 0; u < ILP; ++u) {\n"
                f"        const kf_long g = g0 + u * KF_GSTRIDE;\n        if (g < total) {{\n{decomp}"
                f"        {inner}\n        y[g] = {store};\n    }} }} }}"
            )
            return self.finish(text, final_ctype, py_shape, out, tag, f"_cdiv({work}, p['ILP'])")
        # a loop per element (a reduction): an element per thread, its loop's own loads in flight (ILP
        # elements would run their loops one after the other, on a quarter of the threads)
        text = (
            f"    const kf_long total = {total};\n"
            f"    for (kf_long g = KF_GID; g < total; g += KF_GSTRIDE) {{\n{decomp}"
            f"        {inner}\n        y[g] = {store};\n    }}"
        )
        return self.finish(text, final_ctype, py_shape, out, tag, work)

    def emit_tiled_mm(
        self,
        out: tuple[int, ...],
        py_shape: str,
        batch_dims: list[str],
        sizes: tuple[str, str, str],
        grid_py: tuple[str, str, str],
        a: Callable[[list[str], str, str], str],
        b: Callable[[list[str], str, str], str],
        coords: Callable[[list[str], str, str], list[str]],
        tag: str,
        node: fx.Node | None,
        bias: Callable[[str], str] | None = None,
        skip_above: bool = False,
    ) -> Val:
        """A matrix product in TILE x TILE work-groups staging A and B tiles in local memory: ``a(batch, i, k)``,
        ``b(batch, k, j)`` load (any layout, prologues fused), ``coords(batch, i, j)`` places the output;
        ``sizes`` are the C expressions of M, N, K and ``grid_py`` the Python ones of N, M and the batch. K may
        hold :data:`TILE_END`, one past the last row of the block's output tile (a causal product's bound).
        ``skip_above``: tiles wholly above the diagonal (every j > i) may be left unwritten (the warp tiles
        skip them; nothing reads them)."""
        if self.coop:
            from kfoundry.plugins.llms.offline import lower_mm_warp

            args = (out, py_shape, batch_dims, sizes, grid_py, a, b, coords, tag, node, bias)
            warp = lower_mm_warp.emit(self, *args, skip_above=skip_above)
            if warp is not None:
                return warp
            M, N, K = sizes
            blocked = (M, N, K.replace(TILE_END, "((KF_GRP(1) + 1) * (16 * RB))"))
            return self.emit_blocked_mm(out, py_shape, batch_dims, blocked, *args[4:])
        M, N, K = sizes
        K = K.replace(TILE_END, "((KF_GRP(1) + 1) * TILE)")
        bc = [f"bc{k}" for k in range(len(batch_dims))]
        decl = "".join(
            f"    const kf_long {c} = {e};\n" for c, e in zip(bc, unflat("bz", batch_dims), strict=True)
        )
        cs = coords(bc, "i", "j")
        dims = self.shape_dims(py_shape, out)
        epi, ctype, _ = self.epilogue(node, out, cs, "float")
        add = f" acc += {bias('j')};" if bias is not None else ""
        text = f"""    KF_LOCAL float As[TILE][TILE];
    KF_LOCAL float Bs[TILE][TILE + 1];
    const int tx = KF_LID(0), ty = KF_LID(1);
    const kf_long j = KF_GRP(0) * TILE + tx, i = KF_GRP(1) * TILE + ty, bz = KF_GRP(2);
{decl}    float acc = 0.0f;
    for (kf_long k0 = 0; k0 < (kf_long)({K}); k0 += TILE) {{
        const kf_long ka = k0 + tx, kb = k0 + ty;
        As[ty][tx] = (i < {M} && ka < {K}) ? ({a(bc, "i", "ka")}) : 0.0f;
        Bs[ty][tx] = (kb < {K} && j < {N}) ? ({b(bc, "kb", "j")}) : 0.0f;
        KF_BARRIER;
        float part = 0.0f;
        for (int kk = 0; kk < TILE; ++kk) part += As[ty][kk] * Bs[kk][tx];
        acc += part;
        KF_BARRIER;
    }}
    if (i < {M} && j < {N}) {{{add} y[{horner(cs, dims)}] = {epi}; }}"""
        ydt = "torch.float32"
        self.fwd(f"b{self.nk} = torch.empty({py_shape}, dtype={ydt}, device=dev)")
        gx, gy, gz = grid_py
        launch = (
            f"grid=(_cdiv({gx}, p['TILE']), _cdiv({gy}, p['TILE']), max(1, {gz})), "
            "block=(p['TILE'], p['TILE'], 1)"
        )
        name = self.kernel(text, ctype, "", tag, launch_dims=launch)
        self.fwd(self.sched.kernels[-1].launch)
        return self.buffer_val(name, out, py_shape, ctype)

    def emit_blocked_mm(
        self,
        out: tuple[int, ...],
        py_shape: str,
        batch_dims: list[str],
        sizes: tuple[str, str, str],
        grid_py: tuple[str, str, str],
        a: Callable[[list[str], str, str], str],
        b: Callable[[list[str], str, str], str],
        coords: Callable[[list[str], str, str], list[str]],
        tag: str,
        node: fx.Node | None,
        bias: Callable[[str], str] | None = None,
    ) -> Val:
        """:meth:`emit_tiled_mm` register-blocked (CUDA): 16 x 16 threads, each an RB x RB block of a
        16RB x 16RB output tile, K in steps of 16 through padded shared memory (float4 reads), the next
        step's loads in registers while this one computes. ``b_kfast`` layouts (B[j, k], a linear
        layer's weight) load B along k so that neighbouring threads read neighbouring addresses."""
        M, N, K = sizes
        bc = [f"bc{k}" for k in range(len(batch_dims))]
        decl = "".join(
            f"    const kf_long {c} = {e};\n" for c, e in zip(bc, unflat("bz", batch_dims), strict=True)
        )
        cs = coords(bc, "i", "j")
        dims = self.shape_dims(py_shape, out)
        epi, ctype, _ = self.epilogue(node, out, cs, "float")
        add = f" acc += {bias('j')};" if bias is not None else ""
        kfast = tag == "lintile"
        bmap = (
            "const int bj = ty + 16 * l, bk = tx;"
            if kfast
            else "const int e = tid + 256 * l, bk = e / (16 * RB), bj = e % (16 * RB);"
        )
        load = f"""        #pragma unroll
        for (int l = 0; l < RB; ++l) {{
            const kf_long i = i0 + ty + 16 * l, ka = k0 + tx;
            ra[l] = (i < {M} && ka < {K}) ? ({a(bc, "i", "ka")}) : 0.0f;
        }}
        #pragma unroll
        for (int l = 0; l < RB; ++l) {{
            {bmap}
            const kf_long kb = k0 + bk, j = j0 + bj;
            rb[l] = (kb < {K} && j < {N}) ? ({b(bc, "kb", "j")}) : 0.0f;
        }}"""
        text = f"""    KF_LOCAL KF_ALIGN16 float As[16][16 * RB + 4];
    KF_LOCAL KF_ALIGN16 float Bs[16][16 * RB + 4];
    const int tx = KF_LID(0), ty = KF_LID(1), tid = ty * 16 + tx;
    const kf_long j0 = KF_GRP(0) * (16 * RB), i0 = KF_GRP(1) * (16 * RB), bz = KF_GRP(2);
{decl}    float accv[RB][RB];
    #pragma unroll
    for (int r = 0; r < RB; ++r) {{
        #pragma unroll
        for (int c = 0; c < RB; ++c) accv[r][c] = 0.0f;
    }}
    float ra[RB], rb[RB];
    {{
        const kf_long k0 = 0;
{load}
    }}
    for (kf_long k0 = 0; k0 < (kf_long)({K}); k0 += 16) {{
        #pragma unroll
        for (int l = 0; l < RB; ++l) {{
            As[tx][ty + 16 * l] = ra[l];
            {bmap}
            Bs[bk][bj] = rb[l];
        }}
        KF_BARRIER;
        if (k0 + 16 < (kf_long)({K})) {{
            const kf_long kn = k0 + 16;
            {{
                const kf_long k0 = kn;
{load}
            }}
        }}
        #pragma unroll
        for (int kk = 0; kk < 16; ++kk) {{
            float av[RB], bv[RB];
#if RB % 4 == 0
            #pragma unroll
            for (int q = 0; q < RB; q += 4) {{
                const float4 a4 = KF_LD4(&As[kk][ty * RB + q]);
                const float4 b4 = KF_LD4(&Bs[kk][tx * RB + q]);
                av[q] = a4.x; av[q + 1] = a4.y; av[q + 2] = a4.z; av[q + 3] = a4.w;
                bv[q] = b4.x; bv[q + 1] = b4.y; bv[q + 2] = b4.z; bv[q + 3] = b4.w;
            }}
#else
            #pragma unroll
            for (int q = 0; q < RB; q += 2) {{
                const float2 a2 = KF_LD2(&As[kk][ty * RB + q]);
                const float2 b2 = KF_LD2(&Bs[kk][tx * RB + q]);
                av[q] = a2.x; av[q + 1] = a2.y; bv[q] = b2.x; bv[q + 1] = b2.y;
            }}
#endif
            #pragma unroll
            for (int r = 0; r < RB; ++r) {{
                #pragma unroll
                for (int c = 0; c < RB; ++c) accv[r][c] = KF_FMA(av[r], bv[c], accv[r][c]);
            }}
        }}
        KF_BARRIER;
    }}
    #pragma unroll
    for (int r = 0; r < RB; ++r) {{
        #pragma unroll
        for (int c = 0; c < RB; ++c) {{
            const kf_long i = i0 + ty * RB + r, j = j0 + tx * RB + c;
            if (i < {M} && j < {N}) {{ float acc = accv[r][c];{add} y[{horner(cs, dims)}] = {epi}; }}
        }}
    }}"""
        ydt = "torch.float32"
        self.fwd(f"b{self.nk} = torch.empty({py_shape}, dtype={ydt}, device=dev)")
        gx, gy, gz = grid_py
        launch = (
            f"grid=(_cdiv({gx}, 16 * p['RB']), _cdiv({gy}, 16 * p['RB']), max(1, {gz})), block=(16, 16, 1)"
        )
        self.mm_sizes.append((math.prod(out[-2:]) if len(out) >= 2 else 1, math.prod(out[:-2]) or 1))
        name = self.kernel(text, ctype, "", tag, launch_dims=launch)
        self.fwd(self.sched.kernels[-1].launch)
        return self.buffer_val(name, out, py_shape, ctype)

    def emit_rows(
        self,
        out: tuple[int, ...],
        py_shape: str,
        dim_set: list[int],
        body: Callable[[list[str], Callable[[list[str], str], str]], str],
        tag: str,
        node: fx.Node | None = None,
    ) -> Val:
        """One work item per row (the output coordinates outside ``dim_set``); ``body(coords, store)``
        loops over the row (its coordinates in ``dim_set`` are left for it to set) and calls
        ``store(coords, value)`` for each element written."""
        dims = self.shape_dims(py_shape, out)
        keep = [k for k in range(len(out)) if k not in dim_set]
        kd = [dims[k] for k in keep]
        total = " * ".join(f"(kf_long){d}" for d in kd) or "1"
        coords = [f"c{k}" for k in range(len(out))]
        decomp = decompose("g", kd, [f"c{k}" for k in keep], "rows")
        _, final_ctype, _ = self.epilogue(node, out, coords, "float")

        def store(cs: list[str], value: str) -> str:
            epi, _, _ = self.epilogue(node, out, cs, "float")
            return f"{{ float acc = {value}; y[{horner(cs, dims)}] = {epi}; }}"

        self.lanes_used = False
        inner = body(coords, store)
        work = "*".join(f"{py_shape}[{k}]" for k in keep) or "1"
        if self.lanes_used:  # a warp per row: its lanes share the row's loops and stores
            text = (
                f"    KF_COOP_SCRATCH\n    const kf_long rows = {total};\n    const int kf_lane = KF_LANE;\n"
                f"    for (kf_long g = KF_GID >> 5; g < rows; g += KF_GSTRIDE >> 5) {{\n{decomp}"
                f"        {inner}\n    }}"
            )
            return self.finish(text, final_ctype, py_shape, out, tag, f"32 * ({work})")
        text = (
            f"    const kf_long rows = {total};\n"
            f"    for (kf_long g = KF_GID; g < rows; g += KF_GSTRIDE) {{\n{decomp}"
            f"        {inner}\n    }}"
        )
        return self.finish(text, final_ctype, py_shape, out, tag, work)

    def _quad_loads(
        self, coords: list[str], body: Callable[[list[str]], str], py_shape: str
    ) -> tuple[list[str], str, str] | None:
        """The 16-byte variant of a quad's body: every float buffer load whose last coordinate is the output's
        last one and whose others are output coordinates or 0 reads the quad's four elements side by side
        (the quad does not cross a row where the last dim is a multiple of 4), so it becomes one float4 load
        per (buffer, row) before the element loop; each such load is in bounds for all four elements (its
        buffer's dims cover the output coordinates' ranges, checked in forward), so it may run although the
        body reads it under a guard. Returns (pointer declarations, the run-time condition, the body), or
        None where no load qualifies."""
        last, plain = coords[-1], set(coords)
        found: dict[tuple[str, tuple[str, ...]], int] = {}
        ptrs: list[str] = []
        checks: list[str] = []
        py_of = {v: k for k, v in self.syms.items()}

        def hook(p: str, c: list[str], bdims: list[str], ctype: str) -> str | None:
            if ctype != "float" or not c or c[-1] != last:
                return None
            if any(x != "0" and (x not in plain or x == last) for x in c[:-1]):
                return None
            key = (p, tuple(c[:-1]))
            if key not in found:
                k = found[key] = len(found)
                base = [f"kf_qb{x[1:]}" if x in plain else x for x in c]
                ptrs.append(f"KF_G const float* kf_qp{k} = {p} + {horner(base, bdims)};")
                checks.extend(
                    f"int({py_of.get(d, d)}) >= int({py_shape}[{coords.index(x)}])"
                    for x, d in zip(c, bdims, strict=True)
                    if x != "0"
                )
            return f"kf_ql{found[key]}[kq]"

        saved, self.leaf_hook = self.leaf_hook, hook
        try:
            inner = body(coords)
        finally:
            self.leaf_hook = saved
        if not found:
            return None
        flag = f"_kf_q4_{self.nk}"
        self.fwd(f"{flag} = int({' and '.join(dict.fromkeys(checks)) or 'True'})")
        return ptrs, self.sym(flag), inner

    def _quads(
        self,
        dims: list[str],
        coords: list[str],
        inner: str,
        store: str,
        total: str,
        vec: tuple[list[str], str, str] | None = None,
    ) -> str:
        """A loop-free pointwise body over four consecutive elements (a quad) per work item, QU quads a grid
        stride apart per thread and step (QU a define, :data:`QU_DEFAULT` where undefined; the launch's
        work count is the quads' over QU; a grid stride apart, each load instruction of a warp stays
        coalesced), whatever the shape. The coordinates of a thread's first quad and the mixed-radix digits
        of the grid stride are decomposed once, before the grid-stride loop; each quad's coordinates are the
        previous one's plus the stride's digits with carries (a compare and a subtraction per dimension, no
        division: a 32-bit division by a size known only at run time costs about twenty instructions, and
        four of them per quad kept the pointwise kernels issue-bound). A step runs in two phases: first
        every quad's coordinates (walked from the step's first), pointers and 16-byte loads (``vec``:
        alignment and bounds checked per quad, each quad's pointers from its own coordinates, as an
        operand's rows may be apart by more than the output's), so that QU loads per operand are in flight
        together; then each quad's elements (the next three coordinates step from the first, the last
        coordinate incremented, a carry where it reaches its size; a quad that did not take the 16-byte
        loads reads its elements one by one) and one 16-byte store (the output is contiguous, ``g4`` a
        multiple of 4)."""
        n = len(coords)
        run = [f"kf_qb{k}" for k in range(n)]
        cur = [f"kf_qc{k}" for k in range(n)]
        digits = [f"kf_qs{k}" for k in range(n)]
        first = decompose("kf_g0", dims, run, "total").replace("const kf_long", "kf_long")
        stride = decompose("kf_qg", dims, digits, "total")
        bind = "const kf_long " + ", ".join(f"{c} = {t}" for c, t in zip(coords, cur, strict=True)) + ";"
        step = ""
        for k in range(n):  # the carry chain of one element, built from the outermost coordinate in
            step = f"++{cur[k]};" if k == 0 else f"if (++{cur[k]} == {dims[k]}) {{ {cur[k]} = 0; {step} }}"
        advance = []  # the stride's digits added from the innermost coordinate out; each digit < its size
        for k in range(n - 1, 0, -1):
            carry = " + kf_qk" if k < n - 1 else ""
            advance.append(
                f"{run[k]} += {digits[k]}{carry}; kf_qk = {run[k]} >= {dims[k]}; if (kf_qk) {run[k]} -= {dims[k]};"
            )
        advance.append(f"{run[0]} += {digits[0]}{' + kf_qk' if n > 1 else ''};")
        copy = "kf_long " + ", ".join(f"{t} = {r}" for t, r in zip(cur, run, strict=True)) + ";"

        def elements(body_text: str) -> str:
            return (
                "            #pragma unroll\n            for (int kq = 0; kq < 4; ++kq) {\n"
                "            const kf_long g = g4 + kq;\n            kf_qv[kq] = 0.0f;\n"
                f"            if (g < total) {{\n            {bind}\n"
                f"            {body_text}\n            kf_qv[kq] = {store};\n            }}\n"
                f"            {step}\n            }}\n"
            )

        issue = ""  # phase 1: every quad's 16-byte loads, before any element is computed
        compute = elements(inner)
        head = ""
        if vec is not None:
            ptrs, flag, vec_inner = vec
            n4 = len(ptrs)
            size_t = "size_t" if self.lang == "cuda" else "ulong"
            ld4 = "*reinterpret_cast<KF_G const float4*>({p})" if self.lang == "cuda" else "vload4(0, {p})"
            zero4 = "make_float4(0.0f, 0.0f, 0.0f, 0.0f)" if self.lang == "cuda" else "(float4)(0.0f)"
            aligned = " | ".join(f"({size_t})kf_qp{k}" for k in range(n4))
            loads = " ".join(f"kf_qx{k}[u] = {ld4.format(p=f'kf_qp{k}')};" for k in range(n4))
            # (zeros where a quad takes no 16-byte loads: none of its registers kept from the last step)
            zeros = " ".join(f"kf_qx{k}[u] = {zero4};" for k in range(n4))
            unpack = " ".join(
                f"float kf_ql{k}[4]; kf_ql{k}[0] = kf_qx{k}[u].x; kf_ql{k}[1] = kf_qx{k}[u].y; "
                f"kf_ql{k}[2] = kf_qx{k}[u].z; kf_ql{k}[3] = kf_qx{k}[u].w;"
                for k in range(n4)
            )
            head = f"    const int kf_q4 = {flag} && ({dims[-1]}) % 4 == 0;\n"
            # quad u's coordinates walk from the step's first (kf_qw: ``run`` stays for phase 2 to step
            # again, cheaper in registers than QU saved sets)
            walk = " ".join(advance)
            for k in range(n):
                walk = re.sub(rf"\b{run[k]}\b", f"kf_qw{k}", walk)
            start = ", ".join(f"kf_qw{k} = {r}" for k, r in enumerate(run))
            quad_ptrs = re.sub(r"\bkf_qb(\d+)", r"kf_qw\1", " ".join(ptrs))
            issue = (
                f"        float4 {', '.join(f'kf_qx{k}[QU]' for k in range(n4))};\n        int kf_qf[QU];\n"
                f"        kf_long {start};\n"
                "        #pragma unroll\n"
                "        for (int u = 0; u < QU; ++u) {\n"
                "            const kf_long g4 = kf_g0 + u * kf_qg;\n"
                f"            {quad_ptrs}\n"
                f"            kf_qf[u] = kf_q4 && g4 + 3 < total && (({aligned}) & 15) == 0;\n"
                f"            if (kf_qf[u]) {{ {loads} }} else {{ {zeros} }}\n"
                f"            if (u + 1 < QU) {{ int kf_qk = 0; (void)kf_qk; {walk} }}\n"
                "        }\n"
            )
            compute = (
                f"            if (kf_qf[u]) {{\n            {unpack}\n{elements(vec_inner)}"
                f"            }} else {{\n{compute}            }}\n"
            )
        return (
            f"#ifndef QU\n#define QU {QU_DEFAULT.get(self.lang, 1)}\n#endif\n"
            f"    const kf_long total = {total};\n{head}"
            "    const kf_long kf_qg = KF_GSTRIDE * 4;\n"
            f"    kf_long kf_g0 = KF_GID * 4;\n{first}{stride}"
            "    for (; kf_g0 < total; kf_g0 += QU * kf_qg) {\n"
            f"{issue}"
            "        #pragma unroll\n"
            "        for (int u = 0; u < QU; ++u) {  // phase 2: each quad's elements and store\n"
            "            const kf_long g4 = kf_g0 + u * kf_qg;\n"
            "            if (g4 >= total) break;\n"
            f"            {copy}\n"
            "            float kf_qv[4];\n"
            f"{compute}"
            "            if (g4 + 3 < total) KF_STORE4(y, g4, kf_qv[0], kf_qv[1], kf_qv[2], kf_qv[3]);\n"
            "            else { y[g4] = kf_qv[0]; if (g4 + 1 < total) y[g4 + 1] = kf_qv[1]; "
            "if (g4 + 2 < total) y[g4 + 2] = kf_qv[2]; }\n"
            f"            {{ int kf_qk = 0; (void)kf_qk; {' '.join(advance)} }}\n"
            "        }\n"
            "    }"
        )

    def finish(self, text: str, ctype: str, py_shape: str, out: tuple[int, ...], tag: str, work: str) -> Val:
        ydt = "torch.int64" if ctype == "long" else "torch.float32"
        idx = self.nk
        self.fwd(f"b{idx} = torch.empty({py_shape}, dtype={ydt}, device=dev)")
        name = self.kernel(text, ctype, work, tag)
        self.fwd(self.sched.kernels[-1].launch)
        return self.buffer_val(name, out, py_shape, ctype)

    # -- epilogue fusion --------------------------------------------------------------------------

    def epilogue_chain(self, node: fx.Node | None) -> list[fx.Node]:
        """The single-user elementwise nodes after anchor ``node`` that its kernel can apply on store."""
        chain: list[fx.Node] = []
        if node is None or not self.fuse:
            return chain
        cur = node
        shape = _shape(node)
        while len(self.users[cur]) == 1:
            nxt = self.users[cur][0]
            if nxt.op == "output" or not self.is_elementwise(nxt) or _shape(nxt) != shape:
                break
            others = [a for a in _node_args(nxt) if a is not cur]
            if any(self.order[a] > self.order[node] and a.op != "get_attr" for a in others):
                break
            chain.append(nxt)
            cur = nxt
        return chain

    def epilogue(
        self, node: fx.Node | None, out: tuple[int, ...], coords: list[str], ctype: str, value: str = "acc"
    ) -> tuple[str, str, fx.Node | None]:
        chain = self.epilogue_chain(node)
        if not chain or ctype != "float":
            return value, ctype, None
        assert node is not None
        self.applied.add(node)
        local: dict[fx.Node, str] = {node: "acc"}
        for n in chain:
            local[n] = self.elementwise_expr(n, coords, out, local)
        return local[chain[-1]], "float", chain[-1]

    # -- elementwise ----------------------------------------------------------------------------

    def is_elementwise(self, node: fx.Node) -> bool:
        if node.op not in ("call_function", "call_method", "call_module"):
            return False
        if _is_pyvalue(node):
            return False
        try:
            return node_expr(node, self.gm, lambda a: "x", self.lang) is not None
        except GeneratorUnsupported:
            return False

    def operand(self, a: Any, coords: list[str], out: tuple[int, ...], local: dict[fx.Node, str]) -> str:
        if isinstance(a, fx.Node):
            if a in local:
                return local[a]
            v = self.value(a)
            if isinstance(v, PyVal):  # a size computed in forward reaches the kernel as an argument
                fwd = re.fullmatch(r"P\d+", v.expr) and isinstance(v.value, int | float)
                return v.cname or (self.fsym(f"{v.expr}") if fwd else lit(float(v.value)))
            if self.let_stack and self.let_stack[-1] is not None and v.elementwise_node is None:
                return self._trial(lambda: self.broadcast_load(v, coords, out), bind=True)
            return self.broadcast_load(v, coords, out)
        if isinstance(a, bool) or not isinstance(a, int | float):
            raise GeneratorUnsupported(f"offline generator: operand {a!r} is not a number")
        return lit(float(a))

    def broadcast_load(self, v: Val, coords: list[str], out: tuple[int, ...]) -> str:
        nd = len(out)
        cs = []
        for k, size in enumerate(v.shape):
            od = nd - len(v.shape) + k
            cs.append("0" if size == 1 and out[od] != 1 else coords[od])
        expr = v.load(cs)
        return f"(float)({expr})" if v.ctype != "float" else expr

    def elementwise_expr(
        self, node: fx.Node, coords: list[str], out: tuple[int, ...], local: dict[fx.Node, str] | None = None
    ) -> str:
        loc = local or {}
        scope = self.let_stack[-1] if self.let_stack and not loc else None
        key = (node, tuple(coords))
        if scope is not None and key in scope.memo:
            return scope.memo[key]
        e = node_expr(node, self.gm, lambda a: self.operand(a, coords, out, loc), self.lang)
        assert e is not None
        meta = node.meta.get("tensor_meta")
        if scope is None or getattr(meta, "dtype", None) != torch.float32 or re.fullmatch(r"[\w.]+", e):
            return e
        name = f"kf_t{self.ntemp}"
        self.ntemp += 1
        scope.stmts.append(f"const float {name} = {e};")
        scope.memo[key] = name
        return name

    def _trial(self, load: Callable[[], str], bind: bool = False) -> str:
        """``load()`` (a view's or buffer's loader) with its temporaries hoisted into the current let scope
        where it evaluates its operands unconditionally; else (a cat's guard) inline as a tree, and with
        ``bind`` (a float operand, needed where the scope's statements stand) that tree bound once."""
        top = self.let_stack[-1]
        assert top is not None
        sub = LetScope(memo=dict(top.memo))
        self.let_stack.append(sub)
        try:
            e = load()
        finally:
            self.let_stack.pop()
        if not _GUARDED.search(e):
            top.stmts += sub.stmts
            top.memo = sub.memo
            return e
        self.let_stack.append(None)
        try:
            e = load()
        finally:
            self.let_stack.pop()
        if not bind:
            return e
        if e not in top.memo:
            top.memo[e] = name = f"kf_t{self.ntemp}"
            self.ntemp += 1
            top.stmts.append(f"const float {name} = {e};")
        return top.memo[e]

    def bound_load(self, v: Val, coords: list[str], indent: str = " " * 12) -> tuple[str, str]:
        """(statements, expression) of ``v`` at ``coords``: every float elementwise value of its DAG computed
        once into a ``const float kf_tN`` (a value used N times is emitted once, not N times as a tree).
        The statements go right before the expression's use, where ``coords`` are in scope and the value is
        needed unconditionally (not under a loop over other coordinates or a guard)."""
        scope = LetScope()
        self.let_stack.append(scope)
        try:
            e = self._trial(lambda: v.load(coords)) if v.elementwise_node is None else v.load(coords)
        finally:
            self.let_stack.pop()
        return scope.text(indent), e

    # -- the walk ---------------------------------------------------------------------------------

    def run(self, n_inputs: int) -> Schedule:
        from kfoundry.plugins.llms.offline import lower_ops

        self.sched.n_inputs = n_inputs
        for node in self.gm.graph.nodes:
            if node in self.fused_into or node in self.vals:
                continue
            if node.op == "output":
                _flush(self)
                self.output(node.args[0])
                break
            n = self.order[node]
            if node.op == "placeholder":
                i = self.n_placeholders
                self.n_placeholders += 1
                meta = node.meta.get("tensor_meta")
                if meta is None or not hasattr(meta, "shape"):  # a Python number: a float kernel argument
                    self.vals[node] = PyVal(None, f"x{i}", self.fsym(f"x{i}"))
                    continue
                if not self.has_dev:
                    self.fwd(f"dev = x{i}.device")
                    self.has_dev = True
                self.fwd(f"S{n} = tuple(x{i}.shape)")
                ctype = {torch.int64: "long", torch.bool: "kf_bool"}.get(meta.dtype, "float")
                self.vals[node] = self.buffer_val(f"x{i}", _shape(node), f"S{n}", ctype)
                continue
            if node.op == "get_attr":
                self.value(node)
                continue
            pair = (
                node.op in ("call_function", "call_method")
                and getattr(node.target, "__name__", node.target) in ("max", "min")
                and len(node.args) + len(node.kwargs) > 1
            )  # (values, indices)
            if _is_pyvalue(node) and not pair:
                self.vals[node] = lower_ops.py_value(self, node)
                continue
            if self.is_elementwise(node):
                self.lower_elementwise(node)
                continue
            self.settle(node, lower_ops.lower_node(self, node))
        return self.sched

    def settle(self, node: fx.Node, val: Val) -> None:
        """Record ``val`` as ``node``'s value (its shape variable, and the epilogue chain its kernel
        applied: those nodes take the kernel's buffer); a lowering that emits a later node's kernel
        ahead of the walk (a reduction folded behind its producer) settles that node here too."""
        n = self.order[node]
        self.vals[node] = val
        if isinstance(val, Val) and val.py_shape != f"S{n}":
            self.fwd(f"S{n} = {val.py_shape}")
        chain = self.epilogue_chain(node) if node in self.applied else []
        for m in chain:
            self.fused_into[m] = node
        if chain:
            last = chain[-1]
            self.fwd(f"S{self.order[last]} = S{n}")
            self.vals[last] = self.buffer_val(
                str(val.buffer), _shape(last), f"S{self.order[last]}", val.ctype
            )

    def value(self, node: fx.Node) -> Val | PyVal:
        """The value of ``node`` (a parameter is read where first used)."""
        if node not in self.vals and node.op == "get_attr":
            n = self.order[node]
            attr = _attr(self.gm, str(node.target))
            if not isinstance(attr, torch.Tensor):
                self.vals[node] = PyVal(attr, repr(attr))
            else:
                self.fwd(f"S{n} = tuple({ref_path(str(node.target))}.shape)")
                self.vals[node] = self.buffer_val(ref_path(str(node.target)), _shape(node), f"S{n}")
        out: Val | PyVal = self.vals[node]
        return out

    def tensor(self, a: Any) -> Val:
        if not isinstance(a, fx.Node):
            raise GeneratorUnsupported(f"offline generator: expected a tensor operand, got {a!r}")
        v = self.value(a)
        if not isinstance(v, Val):
            raise GeneratorUnsupported(f"offline generator: {a.name} is not a tensor")
        return v

    def lower_elementwise(self, node: fx.Node) -> None:
        n = self.order[node]
        out = _shape(node)
        shapes = [f"S{self.order[a]}" for a in _node_args(node) if isinstance(self.value(a), Val)]
        self.fwd(f"S{n} = _bshape({', '.join(shapes)})" if len(shapes) > 1 else f"S{n} = {shapes[0]}")
        dims = self.shape_dims(f"S{n}", out)
        if self.fuse:
            self.vals[node] = Val(
                out, dims, lambda c: self.elementwise_expr(node, c, out), f"S{n}", elementwise_node=node
            )
            return
        self.vals[node] = self.emit_pointwise(out, f"S{n}", lambda c: self._bound_acc(node, c, out), "ew")

    def _bound_acc(self, node: fx.Node, coords: list[str], out: tuple[int, ...]) -> str:
        scope = LetScope()
        self.let_stack.append(scope)
        try:
            e = self.elementwise_expr(node, coords, out)
        finally:
            self.let_stack.pop()
        return f"{scope.text()}float acc = {e};"

    def output(self, arg: Any) -> None:
        if not isinstance(arg, fx.Node):
            raise GeneratorUnsupported("offline generator: the reference must return one tensor")
        v = self.vals[arg]
        if isinstance(v, PyVal):
            raise GeneratorUnsupported("offline generator: the reference returns no tensor")
        n = self.order[arg]
        if v.buffer is not None and v.buffer.startswith("b"):
            self.sched.output = f"{v.buffer}.reshape(S{n})"
            return

        def body(c: list[str]) -> str:
            lets, e = self.bound_load(v, c)
            return f"{lets}{v.ctype} acc = {e};"

        val = self.emit_pointwise(v.shape, v.py_shape, body, "out", v.ctype)
        self.sched.output = str(val.buffer)


def _flush(L: Lowering) -> None:
    """Emit the pending sibling reductions (:func:`.lower_group.flush`; imported here: it imports this)."""
    from kfoundry.plugins.llms.offline import lower_group

    lower_group.flush(L)


def _shape(node: fx.Node) -> tuple[int, ...]:
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        raise GeneratorUnsupported(f"offline generator: {node.name} has no tensor shape")
    return tuple(int(s) for s in meta.shape)


def _node_args(node: fx.Node) -> list[fx.Node]:
    return [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]


def _attr(gm: fx.GraphModule, path: str) -> Any:
    obj: Any = gm
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _is_pyvalue(node: fx.Node) -> bool:
    return "tensor_meta" not in node.meta or not hasattr(node.meta["tensor_meta"], "shape")


# -- rendering -----------------------------------------------------------------------------------


def ref_path(target: str) -> str:
    """Python text for the reference submodule or parameter at fx ``target`` (``net.0.weight`` is
    ``self.ref.net[0].weight``: an ``nn.Sequential`` or ``nn.ModuleList`` is indexed)."""
    return "self.ref" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in target.split("."))


def with_shapes(reference_source: str, shapes: dict[str, int | float] | None) -> ast.Module:
    """The reference's syntax tree with the module constants named in ``shapes`` set to those values
    (``a, b = 1, 2`` is split first); running it recomputes what is derived from them."""
    tree = ast.parse(reference_source)
    tree.body = split_assignments(tree.body)
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and shapes):
            continue
        target = stmt.targets[0]
        if isinstance(target, ast.Name) and target.id in shapes:
            stmt.value = ast.Constant(shapes[target.id])
    return ast.fix_missing_locations(tree)


def init_source(reference_source: str, shapes: dict[str, int | float] | None = None) -> str:
    """The reference module without its ``forward`` methods or input functions: the parameter holder
    ``_RefInit`` (its constructor draws the same parameters, in the same order, as the reference's).
    Module constants named in ``shapes`` take those values (a constructor reading a global sees them)."""
    body: list[ast.stmt] = []
    for stmt in with_shapes(reference_source, shapes).body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name in ("get_inputs", "get_init_inputs"):
            continue
        if isinstance(stmt, ast.ClassDef) and stmt.name == "Model":
            stmt.name = "_RefInit"
            stmt.body = [s for s in stmt.body if not (isinstance(s, ast.FunctionDef) and s.name == "forward")]
            stmt.body = stmt.body or [ast.Pass()]
            for node in ast.walk(stmt):  # ``super(Model, self).__init__()``
                if isinstance(node, ast.Name) and node.id == "Model":
                    node.id = "_RefInit"
        if not isinstance(
            stmt, ast.Import | ast.ImportFrom | ast.Assign | ast.AnnAssign | ast.FunctionDef | ast.ClassDef
        ):
            continue
        body.append(stmt)
    return ast.unparse(ast.Module(body=_used_imports(body), type_ignores=[]))


def _used_imports(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` without the imported names nothing else in it reads (``from torch.distributions import
    Pareto`` serves the reference's ``get_inputs`` only, and a candidate may not import it)."""
    code = [s for s in body if not isinstance(s, ast.Import | ast.ImportFrom)]
    used = {n.id for s in code for n in ast.walk(s) if isinstance(n, ast.Name)}
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            names = [a for a in stmt.names if (a.asname or a.name.split(".")[0]) in used]
            if not names:
                continue
            stmt.names = names
        out.append(stmt)
    return out


def kernel_source(sched: Schedule, lang: str, coop: bool = False) -> str:
    text = "".join(k.source for k in sched.kernels)
    # the warp helpers (kf_wsum, ...) also where a non-cooperative schedule's kernel folds with shuffles
    warp = coop or (lang == "cuda" and re.search(r"\bkf_w(sum|max|min|prod)\(", text) is not None)
    head = KERNEL_HEADER[lang] + (COOP_HEADER[lang] + COOP_COMMON if warp else "")
    if lang == "cuda":  # tanh and the quotients by 1 + exp(..) on MUFU: the FAST elementwise forms
        text = fast_expr(text)
        if "KF_TANHF(" in text or "KF_RCP1P(" in text:
            head += "#undef FAST\n#define FAST 1\n" + KF_FAST
    return head + prelude(text, lang) + text + "".join(sched.tail)


def forward_body(sched: Schedule) -> str:
    return "\n".join([*sched.forward, f"return {sched.output}"])


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


__all__ = [
    "Lowering",
    "PY_HELPERS",
    "Schedule",
    "Val",
    "init_source",
    "ref_path",
    "kernel_source",
    "forward_body",
    "horner",
    "unflat",
    "operator",
]
