"""Elementwise-chain recipes: one element per work-item → vector loads → several vectors per work-item.

The whole chain of the reference (read from its fx graph) is fused into one expression, so each
element is read once and written once whatever the chain's length.
"""

from __future__ import annotations

import re

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.elementwise_ops import exact_forms, helper_source, prelude
from kfoundry.plugins.llms.offline.index_width import adapt
from kfoundry.plugins.llms.offline.recipe import OPENCL_VECTOR_HELPERS, Recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec


def _sig(spec: OpSpec, lang: str) -> str:
    n = len(spec.input_shapes)
    if lang == "opencl":
        ins = ", ".join(f"__global const float* restrict in{k}" for k in range(n))
        return f"{ins}, __global float* restrict Y, int n"
    ins = ", ".join(f"const float* __restrict__ in{k}" for k in range(n))
    return f"{ins}, float* __restrict__ Y, int n"


def _forward(spec: OpSpec, grid: str, block: str, extra: str = "") -> tuple[str, list[str]]:
    args = [f"x{k}" for k in range(len(spec.input_shapes))]
    body = f"""
        n = x0.numel()
        y = torch.empty_like(x0)
        self.prog.elementwise({", ".join(args)}, y, n{extra}, grid={grid}, block={block})
        return y
    """
    return body, args


def _loads(spec: OpSpec, index: str) -> str:
    return " ".join(f"float v{k} = in{k}[{index}];" for k in range(len(spec.input_shapes)))


def _scalar_expr(spec: OpSpec, lang: str) -> str:
    """The chain as one scalar C expression, its intermediate values bound once where the spec can."""
    assert spec.expr is not None
    return (spec.expr_lets or spec.expr)(lang)


def opencl_recipes(spec: OpSpec) -> list[Recipe]:
    assert spec.expr is not None
    expr = exact_forms(_scalar_expr(spec, "opencl"), "opencl")
    vector_expr = exact_forms(spec.expr("opencl"), "opencl")  # vector arithmetic: no scalar temporaries
    sig = _sig(spec, "opencl")
    out: list[Recipe] = []
    naive = f"""{prelude(expr, "opencl")}
__kernel void elementwise({sig}) {{
    int i = get_global_id(0);
    if (i >= n) return;
    {_loads(spec, "i")}
    Y[i] = {expr};
}}
"""
    body, args = _forward(spec, "(_cdiv(n, p['BLOCK_X']), 1, 1)", "(p['BLOCK_X'], 1, 1)")
    out.append(
        Recipe(
            "elementwise/naive",
            "elementwise",
            "opencl",
            naive,
            body,
            args,
            TunableSpace(params={"BLOCK_X": [16, 64, 256]}),
            {"BLOCK_X": 64},
            rank=0,
            description="one element per work-item",
        )
    )
    # full vectors where VW elements remain, the last n % VW elements scalar (vloadn needs only float alignment)
    vws = [4, 8]
    sloads = _loads(spec, "e")
    stail = f"for (int e = c * VW; e < n; ++e) {{ {sloads} Y[e] = {expr}; }}"
    vl = " ".join(
        f"float s{k}[VW]; VSTOREV(VLOADV(c, in{k}), 0, s{k});" for k in range(len(spec.input_shapes))
    )
    comp = " ".join(f"float v{k} = s{k}[u];" for k in range(len(spec.input_shapes)))
    vec = f"""{OPENCL_VECTOR_HELPERS}{prelude(expr, "opencl")}
__kernel void elementwise({sig}) {{
    int c0 = get_global_id(0) * WPT;
    #pragma unroll
    for (int w = 0; w < WPT; ++w) {{
        int c = c0 + w;
        if (c * VW >= n) return;
        if (c * VW + VW > n) {{ {stail} return; }}
        {vl}
        float r[VW];
        #pragma unroll
        for (int u = 0; u < VW; ++u) {{ {comp} r[u] = {expr}; }}
        VSTOREV(VLOADV(0, r), c, Y);
    }}
}}
"""
    body, args = _forward(
        spec, "(_cdiv(_cdiv(n, p['VW']), p['BLOCK_X'] * p['WPT']), 1, 1)", "(p['BLOCK_X'], 1, 1)"
    )
    out.append(
        Recipe(
            "elementwise/vector",
            "elementwise",
            "opencl",
            vec,
            body,
            args,
            TunableSpace(params={"VW": vws, "WPT": [1, 2, 4, 8, 16], "BLOCK_X": [1, 4, 16, 64]}),
            {"VW": vws[-1], "WPT": 4, "BLOCK_X": 16},
            rank=1,
            description="vector loads and stores, WPT vectors per work-item",
        )
    )
    # the whole chain in vector arithmetic (vector exp/erf/tanh...; ?: selects per lane, not on SYCL)
    vloads = " ".join(f"floatv v{k} = VLOADV(c, in{k});" for k in range(len(spec.input_shapes)))
    vmath = f"""{OPENCL_VECTOR_HELPERS}{prelude(expr, "opencl")}
__kernel void elementwise({sig}) {{
    int c0 = get_global_id(0) * WPT;
    for (int w = 0; w < WPT; ++w) {{
        int c = c0 + w;
        if (c * VW >= n) return;
        if (c * VW + VW > n) {{ {stail} return; }}
        {vloads}
        VSTOREV({vector_expr}, c, Y);
    }}
}}
"""
    out.append(
        Recipe(
            "elementwise/vector_math",
            "elementwise",
            "opencl",
            vmath,
            body,
            args,
            TunableSpace(params={"VW": vws, "WPT": [1, 2, 4, 8, 16], "BLOCK_X": [1, 4, 16, 64]}),
            {"VW": vws[-1], "WPT": 4, "BLOCK_X": 16},
            rank=2,
            sycl_ok="?" not in vector_expr,
            description="the fused chain evaluated in vector arithmetic (vector math functions)",
        )
    )
    return out


def cuda_recipes(spec: OpSpec) -> list[Recipe]:
    # the FAST recipes rewrite ``expr`` first (:func:`fast_expr`), then make its selects (:func:`select_forms`)
    expr = exact_forms(_scalar_expr(spec, "cuda"), "cuda")
    sexpr = select_forms(expr)
    sig = _sig(spec, "cuda")
    out: list[Recipe] = []
    naive = f"""
extern "C" __global__ void elementwise({sig}) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    {_loads(spec, "i")}
    Y[i] = {sexpr};
}}
"""
    body, args = _forward(spec, "(_cdiv(n, p['BLOCK_X']), 1, 1)", "(p['BLOCK_X'], 1, 1)")
    out.append(
        Recipe(
            "elementwise/naive",
            "elementwise",
            "cuda",
            naive,
            body,
            args,
            TunableSpace(params={"BLOCK_X": [64, 128, 256, 512, 1024]}),
            {"BLOCK_X": 256},
            rank=0,
            description="one element per thread",
        )
    )
    nin = len(spec.input_shapes)
    loads = " ".join(f"float4 q{k} = __ldg(reinterpret_cast<const float4*>(in{k}) + c);" for k in range(nin))

    def lane(comp: str) -> str:
        vs = " ".join(f"float v{k} = q{k}.{comp};" for k in range(nin))
        return f"{{ {vs} r.{comp} = {sexpr}; }}"

    vec = f"""
extern "C" __global__ void __launch_bounds__(BLOCK_X) elementwise({sig}, int vec4) {{
    // grid-stride loop over float4 vectors: every thread moves 16-byte loads and stores; vec4 (every
    // pointer 16-byte aligned, decided in forward) or else one float at a time; the n % 4 tail scalar
    const int stride = gridDim.x * BLOCK_X, t0 = blockIdx.x * BLOCK_X + threadIdx.x;
    const int nv = vec4 ? n / 4 : 0;
    for (int c = t0; c < nv; c += stride) {{
        {loads}
        float4 r;
        {lane("x")} {lane("y")} {lane("z")} {lane("w")}
        reinterpret_cast<float4*>(Y)[c] = r;
    }}
    for (int i = nv * 4 + t0; i < n; i += stride) {{ {_loads(spec, "i")} Y[i] = {sexpr}; }}
}}
"""
    body, args = _forward(
        spec,
        "(max(1, min(_cdiv(_cdiv(n, 4), p['BLOCK_X']), p['WAVES'] * 132)), 1, 1)",
        "(p['BLOCK_X'], 1, 1)",
        extra=f", int(_aligned({', '.join(f'x{k}' for k in range(nin))}, y))",
    )
    out.append(
        Recipe(
            "elementwise/vector_grid_stride",
            "elementwise",
            "cuda",
            vec,
            body,
            args,
            TunableSpace(params={"BLOCK_X": [128, 256, 512, 1024], "WAVES": [1, 2, 4, 8, 16, 64]}),
            {"BLOCK_X": 256, "WAVES": 8},
            rank=1,
            description="float4 loads/stores, grid-stride loop sized in waves of the SMs",
        )
    )
    out.append(_vector_ilp(spec, expr, sig, nin))
    out.append(_vector_blocked(spec, expr, sig, nin))
    helpers = prelude(expr, "cuda") + (KF_SEL if "?" in expr else "")
    for r in out:
        r.kernel = helpers + r.kernel
    return out


#: FAST (CUDA): tanh as :func:`~.elementwise_ops.helper_source`'s ``kf_tanh`` (one MUFU.EX2 and one MUFU.RCP,
#: branch-free, within 2 ulps) instead of tanhf, and a quotient by d = 1 + exp(..) (sigmoid, SiLU, tanh-GELU)
#: as a product with its MUFU.RCP reciprocal (``kf_rcp``, within 1 ulp) instead of an IEEE division (10
#: instructions and a slow path). The reciprocal is taken of d 2^-32 and scaled back by 2^-32: exact
#: scalings, so that 1 / d below 2^-126 (d > 2^126, x < -87.3 in sigmoid) is the IEEE subnormal it rounds
#: to, not the 0 rcp.approx.ftz would give (which a SiLU's x or any larger factor would not bring back).
KF_FAST = (
    helper_source("kf_tanh", "cuda")
    + helper_source("kf_rcp", "cuda")
    + """#if FAST
#define KF_TANHF(u) kf_tanh(u)
#define KF_RCP1P(d) (kf_rcp((d) * 2.3283064e-10f) * 2.3283064e-10f)
#else
#define KF_TANHF(u) tanhf(u)
#define KF_RCP1P(d) (1.0f / (d))
#endif
"""
)

#: ``X / (1.0f + expf(..))`` as the elementwise ops write sigmoid, SiLU and the tanh GELU (a divisor >= 1)
_RCP1P = "/ (1.0f + expf("


def fast_expr(expr: str) -> str:
    """``expr`` with the FAST forms' macros: ``tanhf(`` -> ``KF_TANHF(``, ``X / (1.0f + expf(Y))`` -> ``X *
    KF_RCP1P(1.0f + expf(Y))`` (same grouping: ``/`` and ``*`` bind alike, the divisor's parenthesis becomes
    the call's)."""
    return re.sub(r"\btanhf\(", "KF_TANHF(", expr).replace(_RCP1P, "* KF_RCP1P(1.0f + expf(")


#: ``kf_sel(c, a, b)``: ``c ? a : b`` with both operands evaluated (an inlined function's arguments), so
#: NVVM keeps a select (FSEL, FMNMX) where a ternary with a costly operand becomes a branch: BSSY/BSYNC
#: and both paths run on warps whose lanes disagree (torch.clip's two selects even became a branch tree).
KF_SEL = """#ifndef KF_SEL_DEFINED
#define KF_SEL_DEFINED
static __device__ __forceinline__ float kf_sel(bool c, float a, float b) { return c ? a : b; }
#endif
"""

_C_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?f?)|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>&&|\|\||==|!=|<=|>=|[-+*/<>?:(),!]))"
)
_C_BINARY = [("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/")]
_LETS = re.compile(
    r"\(\[&\]\(\) -> float \{ (?P<body>[^;{}]*;(?: [^;{}]*;)*) return (?P<result>[^;{}]*); \}\(\)\)"
)
_LET = re.compile(r"const float (kf_t\d+) = (.*)")


class _Selects:
    """A cookbook C expression (the subset :mod:`.elementwise_ops` writes) printed back with every
    ternary as ``kf_sel``; anything else raises ValueError."""

    def __init__(self, expr: str) -> None:
        self.toks: list[str] = []
        pos = 0
        while expr[pos:].strip():
            m = _C_TOKEN.match(expr, pos)
            if m is None or m.end() == pos:
                raise ValueError(expr[pos : pos + 20])
            self.toks.append(m.group(m.lastgroup or ""))
            pos = m.end()
        self.i = 0

    def peek(self) -> str:
        return self.toks[self.i] if self.i < len(self.toks) else ""

    def take(self, want: str | None = None) -> str:
        if self.i >= len(self.toks) or want not in (None, self.toks[self.i]):
            raise ValueError(want)
        self.i += 1
        return self.toks[self.i - 1]

    def ternary(self) -> str:
        cond = self.binary(0)
        if self.peek() != "?":
            return cond
        self.take("?")
        a = self.ternary()
        self.take(":")
        return f"kf_sel({cond}, {a}, {self.ternary()})"

    def binary(self, level: int) -> str:
        if level == len(_C_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in _C_BINARY[level]:
            op = self.take()
            left = f"({left} {op} {self.binary(level + 1)})"
        return left

    def unary(self) -> str:
        if self.peek() in ("-", "!"):
            op = self.take()
            return f"({op}{self.unary()})"
        tok = self.take()
        if tok == "(":  # every form printed here delimits itself: (a op b), (-a), f(..), a name, a number
            inner = self.ternary()
            self.take(")")
            return inner
        if not (tok[0].isalnum() or tok[0] in "._"):
            raise ValueError(tok)
        if self.peek() != "(" or tok[0].isdigit() or tok[0] == ".":
            return tok
        self.take("(")
        args = [self.ternary()]
        while self.peek() == ",":
            self.take(",")
            args.append(self.ternary())
        self.take(")")
        return f"{tok}({', '.join(args)})"

    def whole(self) -> str:
        out = self.ternary()
        if self.i != len(self.toks):
            raise ValueError(self.peek())
        return out


def select_forms(expr: str) -> str:
    """``expr`` (CUDA, plain or a ``let_block``) with every ``c ? a : b`` as ``kf_sel(c, a, b)``
    (:data:`KF_SEL`); the same values, bit for bit. Unchanged where the text is outside the subset."""

    def one(text: str) -> str:
        return _Selects(text).whole() if "?" in text else text

    try:
        m = _LETS.fullmatch(expr)
        if m is None:
            return one(expr)
        lets = []
        for statement in m.group("body").split(";")[:-1]:
            let = _LET.fullmatch(statement.strip())
            if let is None:
                return expr
            lets.append(f"const float {let.group(1)} = {one(let.group(2))};")
        return f"([&]() -> float {{ {' '.join(lets)} return {one(m.group('result'))}; }}())"
    except (ValueError, RecursionError):  # outside the subset, or nested past Python's stack
        return expr


def _fast_values(expr: str) -> list[int]:
    return [1, 0] if re.search(r"\btanhf\(", expr) or _RCP1P in expr else [0]


def _vector_ilp(spec: OpSpec, expr: str, sig: str, nin: int) -> Recipe:
    """float4 with ILP vectors per thread per step (all loads issued before any math), over a full grid
    (WAVES 0: each thread one step, as Triton's pointwise kernels) or a grid-stride loop over WAVES x 132
    blocks, and with FAST tanh and sigmoid's reciprocal in MUFU instructions (:data:`KF_FAST`)."""
    fexpr = select_forms(fast_expr(expr))

    def lane(comp: str, u: str) -> str:
        vs = " ".join(f"float v{k} = q{k}[{u}].{comp};" for k in range(nin))
        return f"{{ {vs} r.{comp} = {fexpr}; }}"

    loads = " ".join(
        f"q{k}[u] = __ldg(reinterpret_cast<const float4*>(in{k}) + c + u * stride);" for k in range(nin)
    )
    decl = " ".join(f"float4 q{k}[ILP];" for k in range(nin))
    sloads = _loads(spec, "i")
    kernel = f"""{KF_FAST}extern "C" __global__ void __launch_bounds__(BLOCK_X) elementwise({sig}, int vec4) {{
    // grid-stride over float4 vectors, ILP of them per thread per step: their loads are all in flight
    // before the first store; vec4 (every pointer 16-byte aligned, decided in forward) or else scalar
    const long long stride = (long long)gridDim.x * BLOCK_X, t0 = (long long)blockIdx.x * BLOCK_X + threadIdx.x;
    const long long nv = vec4 ? n / 4 : 0;
    long long c = t0;
    for (; c + (ILP - 1) * stride < nv; c += ILP * stride) {{
        {decl}
        #pragma unroll
        for (int u = 0; u < ILP; ++u) {{ {loads} }}
        #pragma unroll
        for (int u = 0; u < ILP; ++u) {{
            float4 r;
            {lane("x", "u")} {lane("y", "u")} {lane("z", "u")} {lane("w", "u")}
            reinterpret_cast<float4*>(Y)[c + u * stride] = r;
        }}
    }}
    for (; c < nv; c += stride) {{
        {decl.replace("[ILP]", "[1]")}
        {loads.replace("u * stride", "0").replace("[u]", "[0]")}
        float4 r;
        {lane("x", "0")} {lane("y", "0")} {lane("z", "0")} {lane("w", "0")}
        reinterpret_cast<float4*>(Y)[c] = r;
    }}
    for (long long i = nv * 4 + t0; i < n; i += stride) {{ {sloads} Y[i] = {fexpr}; }}
}}
"""
    body, args = _forward(
        spec,
        "(max(1, _cdiv(_cdiv(n, 4), p['BLOCK_X'] * p['ILP']) if p['WAVES'] == 0 else "
        "min(_cdiv(_cdiv(n, 4), p['BLOCK_X'] * p['ILP']), p['WAVES'] * 132)), 1, 1)",
        "(p['BLOCK_X'], 1, 1)",
        extra=f", int(_aligned({', '.join(f'x{k}' for k in range(nin))}, y))",
    )
    fast = _fast_values(expr)
    return Recipe(
        "elementwise/vector_ilp",
        "elementwise",
        "cuda",
        kernel,
        body,
        args,
        TunableSpace(
            params={"BLOCK_X": [128, 256, 512], "WAVES": [0, 4, 8, 16, 32], "ILP": [1, 2, 4], "FAST": fast}
        ),
        {"BLOCK_X": 256, "WAVES": 0, "ILP": 2, "FAST": fast[0]},
        rank=2,
        description="float4, ILP vectors in flight per thread (WAVES 0: one pass over a full grid, "
        "else a grid-stride loop over WAVES x 132 blocks), FAST tanh and sigmoid in MUFU instructions",
    )


def _vector_blocked(spec: OpSpec, expr: str, sig: str, nin: int) -> Recipe:
    """float4, ILP vectors per thread, each block over one contiguous span of BLOCK_X * ILP vectors (as
    torch's vectorized elementwise kernels: a block's loads and stores stay within a few DRAM pages, where
    the full-grid ``vector_ilp`` puts a thread's vectors a grid apart); FAST forms as in ``vector_ilp``."""
    fexpr = select_forms(fast_expr(expr))

    def lane(comp: str, u: str) -> str:
        vs = " ".join(f"float v{k} = q{k}[{u}].{comp};" for k in range(nin))
        return f"{{ {vs} r.{comp} = {fexpr}; }}"

    loads = " ".join(
        f"q{k}[u] = __ldcs(reinterpret_cast<const float4*>(in{k}) + c + u * BLOCK_X);" for k in range(nin)
    )
    guarded = " ".join(
        f"if (c + u * BLOCK_X < nv) q{k}[u] = __ldcs(reinterpret_cast<const float4*>(in{k}) + c + u * BLOCK_X);"
        for k in range(nin)
    )
    decl = " ".join(f"float4 q{k}[ILP];" for k in range(nin))
    kernel = f"""{KF_FAST}extern "C" __global__ void __launch_bounds__(BLOCK_X) elementwise({sig}, int vec4) {{
    // block b owns float4 vectors [b * BLOCK_X * ILP, (b + 1) * BLOCK_X * ILP); thread t the ones t + u *
    // BLOCK_X of it: every load of a step is coalesced and in flight before the first store (streaming
    // cache hints: each byte is touched once); the last block is guarded; scalars past the last float4
    // (or all of them when a pointer is not 16-byte aligned) go to block 0
    const long long nv = vec4 ? n / 4 : 0;
    const long long c = (long long)blockIdx.x * BLOCK_X * ILP + threadIdx.x;
    {decl}
    if (c + (ILP - 1) * BLOCK_X < nv) {{
        #pragma unroll
        for (int u = 0; u < ILP; ++u) {{ {loads} }}
        #pragma unroll
        for (int u = 0; u < ILP; ++u) {{
            float4 r;
            {lane("x", "u")} {lane("y", "u")} {lane("z", "u")} {lane("w", "u")}
            __stcs(reinterpret_cast<float4*>(Y) + c + u * BLOCK_X, r);
        }}
    }} else if (c < nv) {{
        #pragma unroll
        for (int u = 0; u < ILP; ++u) {{ {guarded} }}
        #pragma unroll
        for (int u = 0; u < ILP; ++u) {{
            if (c + u * BLOCK_X >= nv) break;
            float4 r;
            {lane("x", "u")} {lane("y", "u")} {lane("z", "u")} {lane("w", "u")}
            __stcs(reinterpret_cast<float4*>(Y) + c + u * BLOCK_X, r);
        }}
    }}
    if (blockIdx.x == 0)
        for (long long i = nv * 4 + threadIdx.x; i < n; i += BLOCK_X) {{ {_loads(spec, "i")} Y[i] = {fexpr}; }}
}}
"""
    body, args = _forward(
        spec,
        "(max(1, _cdiv(_cdiv(n, 4), p['BLOCK_X'] * p['ILP'])), 1, 1)",
        "(p['BLOCK_X'], 1, 1)",
        extra=f", int(_aligned({', '.join(f'x{k}' for k in range(nin))}, y))",
    )
    fast = _fast_values(expr)
    return Recipe(
        "elementwise/vector_blocked",
        "elementwise",
        "cuda",
        kernel,
        body,
        args,
        TunableSpace(params={"BLOCK_X": [128, 256, 512], "ILP": [1, 2, 4, 8], "FAST": fast}),
        {"BLOCK_X": 128, "ILP": 4, "FAST": fast[0]},
        rank=2,
        description="float4, ILP vectors per thread over one contiguous span per block, streaming "
        "cache hints, FAST tanh and sigmoid in MUFU instructions",
    )


def recipes(spec: OpSpec, language: str) -> list[Recipe]:
    return adapt(opencl_recipes(spec) if language == "opencl" else cuda_recipes(spec), spec)
