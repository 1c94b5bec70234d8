"""Row recipes (softmax, log-softmax, layer norm, RMS norm, reductions over one dimension).

Ladder: multi-pass per row → single-pass online statistics → vector loads → a work-group per row
with a local-memory tree merge → a work-group per row that also caches its row in registers (one
read of the row) → on CUDA, warp-shuffle merges and the warp/block hierarchy.
"""

from __future__ import annotations

from kfoundry.core.models import ParamValue, TunableSpace
from kfoundry.plugins.llms.offline.index_width import adapt
from kfoundry.plugins.llms.offline.recipe import OPENCL_VECTOR_HELPERS, Recipe, to_cuda
from kfoundry.plugins.llms.offline.recognize import OpSpec
from kfoundry.plugins.llms.offline.rowops import RowOp, multipass, row_op


def _sig(spec: OpSpec, lang: str) -> str:
    if lang == "opencl":
        g = "__global const float* restrict"
        wb = f"{g} w, {g} b, " if spec.affine else ""
        return f"{g} X, {wb}__global float* restrict Y, int outer, int R, int inner"
    c = "const float* __restrict__"
    wb = f"{c} w, {c} b, " if spec.affine else ""
    return f"{c} X, {wb}float* __restrict__ Y, int outer, int R, int inner"


def _head(lang: str) -> str:
    return "__kernel void rows" if lang == "opencl" else 'extern "C" __global__ void rows'


def _dims(spec: OpSpec) -> str:
    """Python lines computing ``outer, R, inner`` (the [outer, R, inner] view) and ``y`` from ``x``'s shape."""
    d = spec.dim
    if spec.family == "layer_norm":
        sizes = f"outer, R, inner = _prod(x.shape[:{d}]), _prod(x.shape[{d}:]), 1"
    else:
        sizes = f"outer, R, inner = _prod(x.shape[:{d}]), x.shape[{d}], _prod(x.shape[{d + 1}:])"
    if spec.family != "reduce":
        alloc = "y = torch.empty_like(x)"
    else:
        keep = " + (1,)" if len(spec.output_shape) == len(spec.input_shapes[0]) else ""
        alloc = f"y = torch.empty(x.shape[:{d}]{keep} + x.shape[{d + 1}:], dtype=x.dtype, device=x.device)"
    return f"{sizes}\n{alloc}"


def _forward(spec: OpSpec, grid: str, block: str, program: str = "self.prog", extra: str = "") -> str:
    wb = "self.m0.weight, self.m0.bias, " if spec.affine else ""
    return f"""
{_dims(spec)}
{program}.rows(x, {wb}y, outer, R, inner{extra}, grid={grid}, block={block})
return y
"""


def _write_loop(op: RowOp, spec: OpSpec, start: str, step: str, load: str, store: str) -> str:
    if op.reduce:
        return ""
    return f"for (int r = {start}; r < R; r += {step}) {{ float x = {load}; int j = r; {store} = {op.out}; }}"


def _space_1d(block: list[int]) -> TunableSpace:
    return TunableSpace(params={"BLOCK_X": block})


def opencl_recipes(spec: OpSpec) -> list[Recipe]:
    lang = "opencl"
    op = row_op(spec, lang)
    sig = _sig(spec, lang)
    mods = spec.modules
    out: list[Recipe] = []
    fam = spec.family
    setup = (
        "int g = get_global_id(0);\n    if (g >= outer * inner) return;\n    int o = g / inner, i = g % inner;\n"
        "    __global const float* xr = X + (long)o * R * inner + i;\n"
        "    __global float* yr = Y + (long)o * (REDUCE_OUT ? 1 : R) * inner + i;"
    ).replace("REDUCE_OUT", "1" if op.reduce else "0")
    stmts, expr = multipass(spec, lang, "xr[(long)({r}) * inner]")
    write = (
        f"yr[0] = {expr};"
        if op.reduce
        else f"for (int r = 0; r < R; ++r) {{ float x = xr[(long)r * inner]; int j = r; yr[(long)r * inner] = {expr}; }}"
    )
    naive = f"""
{_head(lang)}({sig}) {{
    {setup}
    {stmts}
    {write}
}}
"""
    grid1 = "(_cdiv(outer * inner, p['BLOCK_X']), 1, 1)"
    out.append(
        Recipe(
            f"{fam}/naive",
            fam,
            lang,
            naive,
            _forward(spec, grid1, "(p['BLOCK_X'], 1, 1)"),
            ["x"],
            _space_1d([1, 4, 16, 64]),
            {"BLOCK_X": 16},
            rank=0,
            modules=mods,
            description="one work-item per row, one pass over the row per statistic",
        )
    )

    final_write = (
        f"yr[0] = {op.result};"
        if op.reduce
        else _write_loop(op, spec, "0", "1", "xr[(long)r * inner]", "yr[(long)r * inner]")
    )
    online = f"""
{_head(lang)}({sig}) {{
    {setup}
    {op.declare()}
    for (int r = 0; r < R; ++r) {{ float x = xr[(long)r * inner]; {op.acc} }}
    {op.final}
    {final_write}
}}
"""
    out.append(
        Recipe(
            f"{fam}/online",
            fam,
            lang,
            online,
            _forward(spec, grid1, "(p['BLOCK_X'], 1, 1)"),
            ["x"],
            _space_1d([1, 4, 16, 64]),
            {"BLOCK_X": 16},
            rank=1,
            modules=mods,
            description="one work-item per row, single-pass online statistics",
        )
    )

    # vector recipes need rows along the last dimension; a row's last R % VW elements take a scalar tail
    vws = [2, 4, 8] if spec.inner == 1 else []
    if vws:
        vwrite = (
            ""
            if op.reduce
            else f"""
    for (int c = 0; c < R / VW; ++c) {{
        float xs[VW];
        VSTOREV(VLOADV(c, xr), 0, xs);
        #pragma unroll
        for (int u = 0; u < VW; ++u) {{ float x = xs[u]; int j = c * VW + u; xs[u] = {op.out}; }}
        VSTOREV(VLOADV(0, xs), c, yr);
    }}
    for (int j = (R / VW) * VW; j < R; ++j) {{ float x = xr[j]; yr[j] = {op.out}; }}"""
        )
        vec = f"""{OPENCL_VECTOR_HELPERS}
{_head(lang)}({sig}) {{
    {setup}
    {op.declare()}
    for (int c = 0; c < R / VW; ++c) {{
        float xs[VW];
        VSTOREV(VLOADV(c, xr), 0, xs);
        #pragma unroll
        for (int u = 0; u < VW; ++u) {{ float x = xs[u]; {op.acc} }}
    }}
    for (int t = (R / VW) * VW; t < R; ++t) {{ float x = xr[t]; {op.acc} }}
    {op.final}
    {f"yr[0] = {op.result};" if op.reduce else ""}{vwrite}
}}
"""
        out.append(
            Recipe(
                f"{fam}/vector",
                fam,
                lang,
                vec,
                _forward(spec, grid1, "(p['BLOCK_X'], 1, 1)"),
                ["x"],
                TunableSpace(params={"VW": vws, "BLOCK_X": [1, 4, 16, 64]}),
                {"VW": vws[-1], "BLOCK_X": 4},
                rank=1,
                modules=mods,
                description="one work-item per row, vector loads, online statistics",
            )
        )

    if vws and fam in ("softmax", "log_softmax", "rms_norm", "layer_norm"):
        out.append(_opencl_vector_native(spec, sig, setup, grid1, vws))
    names = [n for n, _ in op.stats]
    shared = "\n    ".join(f"__local float sh_{n}[BR * BI];" for n in names)
    save = " ".join(f"sh_{n}[tr * BI + ti] = {n};" for n in names)
    load_o = " ".join(f"float {n}_o = sh_{n}[(tr + s) * BI + ti];" for n in names)
    bcast = " ".join(f"{n} = sh_{n}[ti];" for n in names)
    wg_write = (
        f"if (tr == 0 && valid) Y[(long)o * inner + i] = {op.result};"
        if op.reduce
        else "if (valid) " + _write_loop(op, spec, "tr", "BR", "xr[(long)r * inner]", "yr[(long)r * inner]")
    )
    wg = f"""
{_head(lang)}({sig}) {{
    {shared}
    int ti = get_local_id(0), tr = get_local_id(1);
    int i = get_group_id(0) * BI + ti, o = get_group_id(1);
    int valid = i < inner;
    __global const float* xr = X + (long)o * R * inner + i;
    __global float* yr = Y + (long)o * R * inner + i;
    {op.declare()}
    if (valid) for (int r = tr; r < R; r += BR) {{ float x = xr[(long)r * inner]; {op.acc} }}
    {save}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = BR / 2; s > 0; s >>= 1) {{
        if (tr < s) {{ {load_o} {op.merge} {save} }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    {bcast}
    {op.final}
    {wg_write}
}}
"""
    bis = [1] if spec.inner == 1 else [1, 4, 16]
    out.append(
        Recipe(
            f"{fam}/workgroup",
            fam,
            lang,
            wg,
            _forward(spec, "(_cdiv(inner, p['BI']), outer, 1)", "(p['BI'], p['BR'], 1)"),
            ["x"],
            TunableSpace(params={"BI": bis, "BR": [2, 4, 8, 16, 32, 64]}, restrictions=["BI * BR <= 256"]),
            {"BI": bis[-1], "BR": 16 if spec.inner == 1 else 4},
            rank=2,
            modules=mods,
            description="a work-group per row: strided online statistics, local-memory tree merge",
        )
    )

    if vws:
        cw = (
            ""
            if op.reduce
            else f"""
    #pragma unroll
    for (int c = 0; c < CH; ++c) {{
        int cc = tr + c * BR;
        if (cc < ROW_LEN / VW) {{
            float xs[VW];
            VSTOREV(cache[c], 0, xs);
            #pragma unroll
            for (int u = 0; u < VW; ++u) {{ float x = xs[u]; int j = cc * VW + u; xs[u] = {op.out}; }}
            VSTOREV(VLOADV(0, xs), cc, yr);
        }}
    }}
    if (tr == 0) for (int j = (ROW_LEN / VW) * VW; j < ROW_LEN; ++j) {{ float x = xr[j]; yr[j] = {op.out}; }}"""
        )
        shared1 = "\n    ".join(f"__local float sh_{n}[BR];" for n in names)
        save1 = " ".join(f"sh_{n}[tr] = {n};" for n in names)
        load1 = " ".join(f"float {n}_o = sh_{n}[tr + s];" for n in names)
        bcast1 = " ".join(f"{n} = sh_{n}[0];" for n in names)
        cached = f"""{OPENCL_VECTOR_HELPERS}
// ROW_LEN (the row length) is defined when the program is built for the input's shape
#define CH_ ((ROW_LEN / VW + BR - 1) / BR)
#define CH (CH_ > 0 ? CH_ : 1)
{_head(lang)}({sig}) {{
    {shared1}
    int tr = get_local_id(0), o = get_group_id(0);
    __global const float* xr = X + (long)o * ROW_LEN;
    __global float* yr = Y + (long)o * ROW_LEN;
    floatv cache[CH];
    {op.declare()}
    #pragma unroll
    for (int c = 0; c < CH; ++c) {{
        int cc = tr + c * BR;
        if (cc < ROW_LEN / VW) {{
            cache[c] = VLOADV(cc, xr);
            float xs[VW];
            VSTOREV(cache[c], 0, xs);
            #pragma unroll
            for (int u = 0; u < VW; ++u) {{ float x = xs[u]; {op.acc} }}
        }}
    }}
    if (tr == 0) for (int t = (ROW_LEN / VW) * VW; t < ROW_LEN; ++t) {{ float x = xr[t]; {op.acc} }}
    {save1}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = BR / 2; s > 0; s >>= 1) {{
        if (tr < s) {{ {load1} {op.merge} {save1} }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    {bcast1}
    {op.final}
    {f"if (tr == 0) Y[o] = {op.result};" if op.reduce else ""}{cw}
}}
"""
        out.append(
            Recipe(
                f"{fam}/workgroup_register_cache",
                fam,
                lang,
                cached,
                _forward(spec, "(outer, 1, 1)", "(p['BR'], 1, 1)", program="self._program(ROW_LEN=R)"),
                ["x"],
                TunableSpace(
                    params={"VW": vws, "BR": [1, 2, 4, 8, 16, 32, 64, 128]},
                    restrictions=[f"({spec.R} // VW + BR - 1) // BR <= 64"],
                ),
                {"VW": vws[-1], "BR": 16},
                rank=3,
                modules=mods,
                lazy=True,
                description="a work-group per row, vector loads, the row cached in registers (read once)",
            )
        )
    return out


def _hreduce(var: str, vec: str, how: str) -> str:
    """Fold the VW lanes of vector ``vec`` into scalar ``var`` (``how``: sum or max)."""
    step = f"{var} += t[u];" if how == "sum" else f"{var} = fmax({var}, t[u]);"
    return f"{{ float t[VW]; VSTOREV({vec}, 0, t); for (int u = 0; u < VW; ++u) {step} }}"


def _opencl_vector_native(spec: OpSpec, sig: str, setup: str, grid: str, vws: list[int]) -> Recipe:
    """Multi-pass with every pass in vector arithmetic (vector exp/rsqrt): the CPU-friendly form."""
    fam = spec.family
    ld = "VLOADV(c, xr)"
    loop = "for (int c = 0; c < R / VW; ++c)"
    eps = f"{spec.eps!r}f"
    tail = "for (int t = (R / VW) * VW; t < R; ++t)"  # the row's last R % VW elements, scalar
    if fam in ("softmax", "log_softmax"):
        body = f"""floatv vm = (floatv)(-INFINITY);
    {loop} vm = fmax(vm, {ld});
    float m = -INFINITY;
    {_hreduce("m", "vm", "max")}
    {tail} m = fmax(m, xr[t]);
    floatv vs = (floatv)(0.0f);
    float s = 0.0f;"""
        if fam == "softmax":
            body += f"""
    {loop} {{ floatv e = exp({ld} - (floatv)(m)); vs += e; VSTOREV(e, c, yr); }}
    {tail} {{ float e = exp(xr[t] - m); s += e; yr[t] = e; }}
    {_hreduce("s", "vs", "sum")}
    float inv = 1.0f / s;
    {loop} VSTOREV(VLOADV(c, yr) * (floatv)(inv), c, yr);
    {tail} yr[t] *= inv;"""
        else:
            body += f"""
    {loop} vs += exp({ld} - (floatv)(m));
    {tail} s += exp(xr[t] - m);
    {_hreduce("s", "vs", "sum")}
    float lse = m + log(s);
    {loop} VSTOREV({ld} - (floatv)(lse), c, yr);
    {tail} yr[t] = xr[t] - lse;"""
    elif fam == "rms_norm":
        body = f"""floatv vq = (floatv)(0.0f);
    {loop} {{ floatv v = {ld}; vq += v * v; }}
    float q = 0.0f;
    {tail} q += xr[t] * xr[t];
    {_hreduce("q", "vq", "sum")}
    float rstd = rsqrt(q / (float)R + {eps});
    {loop} VSTOREV({ld} * (floatv)(rstd), c, yr);
    {tail} yr[t] = xr[t] * rstd;"""
    else:
        affine = " * VLOADV(c, w) + VLOADV(c, b)" if spec.affine else ""
        saffine = " * w[t] + b[t]" if spec.affine else ""
        body = f"""floatv vs = (floatv)(0.0f);
    {loop} vs += {ld};
    float mean = 0.0f;
    {tail} mean += xr[t];
    {_hreduce("mean", "vs", "sum")}
    mean /= (float)R;
    floatv vq = (floatv)(0.0f);
    {loop} {{ floatv d = {ld} - (floatv)(mean); vq += d * d; }}
    float var = 0.0f;
    {tail} var += (xr[t] - mean) * (xr[t] - mean);
    {_hreduce("var", "vq", "sum")}
    float rstd = rsqrt(var / (float)R + {eps});
    {loop} VSTOREV(({ld} - (floatv)(mean)) * (floatv)(rstd){affine}, c, yr);
    {tail} yr[t] = (xr[t] - mean) * rstd{saffine};"""
    kernel = f"""{OPENCL_VECTOR_HELPERS}
{_head("opencl")}({sig}) {{
    {setup}
    {body}
}}
"""
    return Recipe(
        f"{fam}/vector_passes",
        fam,
        "opencl",
        kernel,
        _forward(spec, grid, "(p['BLOCK_X'], 1, 1)"),
        ["x"],
        TunableSpace(params={"VW": vws, "BLOCK_X": [1, 2, 4, 8, 16]}),
        {"VW": vws[-1], "BLOCK_X": 1},
        rank=2,
        modules=spec.modules,
        description="one work-item per row, every pass in vector arithmetic",
    )


def cuda_recipes(spec: OpSpec) -> list[Recipe]:
    lang = "cuda"
    op = row_op(spec, lang)
    sig = _sig(spec, lang)
    mods = spec.modules
    fam = spec.family
    out: list[Recipe] = []
    setup = (
        "int g = blockIdx.x * blockDim.x + threadIdx.x;\n    if (g >= outer * inner) return;\n"
        "    int o = g / inner, i = g % inner;\n    const float* xr = X + (size_t)o * R * inner + i;\n"
        f"    float* yr = Y + (size_t)o * {'1' if op.reduce else 'R'} * inner + i;"
    )
    stmts, expr = multipass(spec, lang, "xr[(size_t)({r}) * inner]")
    write = (
        f"yr[0] = {expr};"
        if op.reduce
        else f"for (int r = 0; r < R; ++r) {{ float x = xr[(size_t)r * inner]; int j = r; yr[(size_t)r * inner] = {expr}; }}"
    )
    grid1 = "(_cdiv(outer * inner, p['BLOCK_X']), 1, 1)"
    out.append(
        Recipe(
            f"{fam}/naive",
            fam,
            lang,
            f"\n{_head(lang)}({sig}) {{\n    {setup}\n    {stmts}\n    {write}\n}}\n",
            _forward(spec, grid1, "(p['BLOCK_X'], 1, 1)"),
            ["x"],
            _space_1d([32, 64, 128, 256]),
            {"BLOCK_X": 128},
            rank=0,
            modules=mods,
            description="one thread per row, one pass per statistic",
        )
    )
    names = [n for n, _ in op.stats]
    shared = "\n    ".join(f"__shared__ float sh_{n}[BR * BI];" for n in names)
    save = " ".join(f"sh_{n}[tr * BI + ti] = {n};" for n in names)
    load_o = " ".join(f"float {n}_o = sh_{n}[(tr + s) * BI + ti];" for n in names)
    bcast = " ".join(f"{n} = sh_{n}[ti];" for n in names)
    wg_write = (
        f"if (tr == 0 && valid) Y[(size_t)o * inner + i] = {op.result};"
        if op.reduce
        else "if (valid) "
        + _write_loop(op, spec, "tr", "BR", "xr[(size_t)r * inner]", "yr[(size_t)r * inner]")
    )
    wg = f"""
{_head(lang)}({sig}) {{
    {shared}
    int ti = threadIdx.x, tr = threadIdx.y;
    int i = blockIdx.x * BI + ti, o = blockIdx.y;
    bool valid = i < inner;
    const float* xr = X + (size_t)o * R * inner + i;
    float* yr = Y + (size_t)o * R * inner + i;
    {op.declare()}
    if (valid) for (int r = tr; r < R; r += BR) {{ float x = xr[(size_t)r * inner]; {op.acc} }}
    {save}
    __syncthreads();
    for (int s = BR / 2; s > 0; s >>= 1) {{
        if (tr < s) {{ {load_o} {op.merge} {save} }}
        __syncthreads();
    }}
    {bcast}
    {op.final}
    {wg_write}
}}
"""
    bis = [1] if spec.inner == 1 else [8, 16, 32]
    out.append(
        Recipe(
            f"{fam}/block_tree",
            fam,
            lang,
            wg,
            _forward(spec, "(_cdiv(inner, p['BI']), outer, 1)", "(p['BI'], p['BR'], 1)"),
            ["x"],
            TunableSpace(
                params={"BI": bis, "BR": [4, 8, 16, 32, 64, 128, 256]},
                restrictions=["BI * BR <= 1024", "BI * BR >= 32"],
            ),
            {"BI": bis[-1], "BR": 256 if spec.inner == 1 else 8},
            rank=2,
            modules=mods,
            description="a block per row, strided online statistics, shared-memory tree merge",
        )
    )
    if spec.inner != 1:
        return out
    shfl = " ".join(f"float {n}_o = __shfl_xor_sync(0xffffffffu, {n}, off);" for n in names)
    # float4 loads only where every row starts 16-byte aligned (vec4, decided in forward), else scalar
    loads = (
        "if (vec4) { const float4* xr4 = reinterpret_cast<const float4*>(xr);\n"
        "    for (int c = lane; c < R / 4; c += 32) { float4 q = __ldg(xr4 + c);"
        " float x; x = q.x; ACC x = q.y; ACC x = q.z; ACC x = q.w; ACC } }\n"
        "    else for (int r = lane; r < R; r += 32) { float x = __ldg(xr + r); ACC }"
    ).replace("ACC", op.acc)
    warp_write = (
        f"if (lane == 0) Y[row] = {op.result};"
        if op.reduce
        else f"for (int r = lane; r < R; r += 32) {{ float x = __ldg(xr + r); int j = r; yr[r] = {op.out}; }}"
    )
    warp = f"""
{_head(lang)}({sig.replace("int inner", "int inner, int vec4")}) {{
    // one warp per row: lanes stride the row, statistics meet through warp shuffles
    const int lane = threadIdx.x & 31;
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= outer) return;
    const float* xr = X + (size_t)row * R;
    float* yr = Y + (size_t)row * R;
    {op.declare()}
    {loads}
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
    {op.final}
    {warp_write}
}}
"""
    out.append(
        Recipe(
            f"{fam}/warp_shuffle",
            fam,
            lang,
            warp,
            _forward(
                spec,
                "(_cdiv(outer * 32, p['BLOCK_X']), 1, 1)",
                "(p['BLOCK_X'], 1, 1)",
                extra=", int(R % 4 == 0 and _aligned(x))",
            ),
            ["x"],
            _space_1d([32, 64, 128, 256]),
            {"BLOCK_X": 128},
            rank=2,
            modules=mods,
            description="a warp per row, warp-shuffle merge of online statistics",
        )
    )
    save_w = " ".join(f"sh_{n}[warp] = {n};" for n in names)
    load_w = " ".join(f"{n} = lane < NWARPS ? sh_{n}[lane] : {init};" for n, init in op.stats)
    bc_w = " ".join(f"sh_{n}[0] = {n};" for n in names)
    get_w = " ".join(f"{n} = sh_{n}[0];" for n in names)
    shared_w = "\n    ".join(f"__shared__ float sh_{n}[32];" for n in names)
    hier_write = (
        f"if (threadIdx.x == 0) Y[row] = {op.result};"
        if op.reduce
        else f"""
    if (!vec4) {{
        for (int r = threadIdx.x; r < R; r += BLOCK) {{ float x = __ldg(X + (size_t)row * R + r); int j = r; Y[(size_t)row * R + r] = {op.out}; }}
        return;
    }}
    float4* yr4 = reinterpret_cast<float4*>(Y + (size_t)row * ROW_LEN);
    #pragma unroll
    for (int c = 0; c < CH; ++c) {{
        int cc = threadIdx.x + c * BLOCK;
        if (cc < ROW_LEN / 4) {{
            float4 q = cache[c];
            float x; int j = cc * 4;
            x = q.x; q.x = {op.out}; x = q.y; ++j; q.y = {op.out}; x = q.z; ++j; q.z = {op.out}; x = q.w; ++j; q.w = {op.out};
            yr4[cc] = q;
        }}
    }}"""
    )
    hier = f"""
// ROW_LEN (the row length) is defined when the program is built for the input's shape
#define NWARPS (BLOCK / 32)
#define CH_ ((ROW_LEN / 4 + BLOCK - 1) / BLOCK)
#define CH (CH_ > 0 ? CH_ : 1)
extern "C" __global__ void __launch_bounds__(BLOCK) rows({sig.replace("int inner", "int inner, int vec4")}) {{
    // a block per row: float4 loads cached in registers (when the rows are 16-byte aligned, vec4),
    // warp shuffles, then shared memory across warps
    {shared_w}
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x;
    const float4* xr4 = reinterpret_cast<const float4*>(X + (size_t)row * ROW_LEN);
    float4 cache[CH];
    {op.declare()}
    if (vec4) {{
        #pragma unroll
        for (int c = 0; c < CH; ++c) {{
            int cc = threadIdx.x + c * BLOCK;
            if (cc < ROW_LEN / 4) {{
                float4 q = __ldg(xr4 + cc);
                cache[c] = q;
                {op.acc4}
            }}
        }}
    }} else {{
        for (int r = threadIdx.x; r < R; r += BLOCK) {{ float x = __ldg(X + (size_t)row * R + r); {op.acc} }}
    }}
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
    if (lane == 0) {{ {save_w} }}
    __syncthreads();
    if (warp == 0) {{
        {load_w}
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
        if (lane == 0) {{ {bc_w} }}
    }}
    __syncthreads();
    {get_w}
    {op.final}
    {hier_write}
}}
"""
    out.append(
        Recipe(
            f"{fam}/block_hierarchical",
            fam,
            lang,
            hier,
            _forward(
                spec,
                "(outer, 1, 1)",
                "(p['BLOCK'], 1, 1)",
                program="self._program(ROW_LEN=R)",
                extra=", int(R % 4 == 0 and _aligned(x, y))",
            ),
            ["x"],
            TunableSpace(
                params={"BLOCK": [64, 128, 256, 512, 1024]},
                restrictions=[f"({spec.R} // 4 + BLOCK - 1) // BLOCK <= 32"],
            ),
            {"BLOCK": 256},
            rank=3,
            modules=mods,
            lazy=True,
            description="a block per row: float4 loads cached in registers, warp shuffles then shared memory",
        )
    )
    if not op.reduce:
        out.append(_cluster_rows(spec, op, sig, warp))
        out.append(_cluster_stream(spec, op, sig, warp))
        from kfoundry.plugins.llms.offline.cookbook_rows_bulk import cluster_bulk  # noqa: PLC0415

        out.append(cluster_bulk(spec, op, sig, warp))  # the same, its loads on the copy engine
    return out


#: Python of the cluster recipe's ``forward``: the blocks per row (a cluster of 1 to 8), the fewest that
#: give two blocks per SM with at most 64 KB of the row each, else the most that fit; 0 where the row
#: does not split into float4 chunks of at most ``limit`` bytes.
_CLUSTER_PY = """

def _cluster(rows, R, limit=200 * 1024):
    \"\"\"Blocks per row of a cluster recipe (0: the rows do not split; the warp kernel runs).\"\"\"
    best = 0
    for cl in (1, 2, 4, 8):
        if R % (4 * cl) or R * 4 // cl > limit:
            continue
        best = cl
        if rows * cl >= 2 * 132 and R * 4 // cl <= 64 * 1024:
            return cl
    return best
"""


def _cluster_size(spec: OpSpec) -> int:
    """:data:`_CLUSTER_PY`'s ``_cluster`` at the traced shape (the cluster recipes' ranks depend on it)."""
    ns: dict[str, object] = {}
    exec(_CLUSTER_PY, ns)  # noqa: S102 - our own helper source
    return int(ns["_cluster"](spec.outer, spec.R))  # type: ignore[operator]


def _cluster_parts(op: RowOp, decl: str, slot: str) -> tuple[str, str, str, str, str, str, str]:
    """C snippets of the cluster recipes: the warp shuffle merge, the shared declarations (a block's
    partials ``part_<stat>`` sized ``decl``), a warp's save and warp 0's load of the warp partials, the
    block partial's store (at ``slot``), the remote read of rank ``rk``'s partial, the float4 output."""
    names = [n for n, _ in op.stats]
    shfl = " ".join(f"float {n}_o = __shfl_xor_sync(0xffffffffu, {n}, off);" for n in names)
    shared = "\n    ".join(f"__shared__ float sh_{n}[32]; __shared__ float part_{n}{decl};" for n in names)
    save_w = " ".join(f"sh_{n}[warp] = {n};" for n in names)
    load_w = " ".join(f"{n} = lane < NWARPS ? sh_{n}[lane] : {init};" for n, init in op.stats)
    bc_w = " ".join(f"part_{n}{slot} = {n};" for n in names)
    remote = " ".join(
        f"float {n}_o = *static_cast<float*>(__cluster_map_shared_rank(&part_{n}{slot}, rk));" for n in names
    )
    out4 = (
        f"float x; int j = j0; x = q.x; q.x = {op.out}; x = q.y; ++j; q.y = {op.out}; "
        f"x = q.z; ++j; q.z = {op.out}; x = q.w; ++j; q.w = {op.out};"
    )
    return shfl, shared, save_w, load_w, bc_w, remote, out4


def cluster_partials(op: RowOp, parts: tuple[str, ...]) -> str:
    """C of a persistent cluster row kernel: the block's statistics (one per thread, in the caller's
    scope) folded through warp shuffles and warp 0 into this row's slot ``part_<stat>[buf]``."""
    shfl, _, save_w, load_w, bc_w, _, _ = parts
    return f"""#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
        if (lane == 0) {{ {save_w} }}
        __syncthreads();
        if (warp == 0) {{
            {load_w}
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
            if (lane == 0) {{ {bc_w} }}
        }}"""


def cluster_totals(op: RowOp, parts: tuple[str, ...]) -> str:
    """C after :func:`cluster_partials`: the next row's ticket (rank 0), the cluster barrier, the CL
    partials merged in rank order into statistics declared here, ``next``, ``more`` and the family's final
    values."""
    remote = parts[5]
    return f"""if (rank == 0 && threadIdx.x == 0) sh_next[buf] = (int)gridDim.y + atomicAdd(counter, 1);
        // partials (and the next row) visible to the cluster; a slot written here is rewritten two rows
        // on, after every block has passed the next barrier, so after every read of it
        __cluster_barrier_arrive();
        __cluster_barrier_wait();
        {op.declare()}
        #pragma unroll
        for (int rk = 0; rk < CL; ++rk) {{ {remote} {op.merge} }}
        const int next = *static_cast<int*>(__cluster_map_shared_rank(&sh_next[buf], 0));
        const bool more = next < outer;
        {op.final}"""


def _cluster_rows(spec: OpSpec, op: RowOp, sig: str, warp: str) -> Recipe:
    """A cluster of CL blocks per row (sm_90): each block keeps its CL-th of the row in shared memory
    (float4 loads, UNROLL in flight), the row's statistics meet through warp shuffles, shared memory and
    the cluster's distributed shared memory (every block merges the CL partials in rank order), then each
    block writes its chunk from shared memory: one read and one write of the row. Rows that do not split
    into float4 chunks of at most 200 KB, or unaligned data, run the warp-per-row kernel."""
    shfl, shared, save_w, load_w, bc_w, remote, out4 = _cluster_parts(op, "", "")
    acc4 = op.acc4
    csig = sig.replace("int inner", "int inner, int vec4")
    kernel = f"""{warp.replace("void rows(", "void rows_warp(")}
// ROW_LEN (the row length) and CL (blocks per row) are defined when the program is built
#define NWARPS (BLOCK / 32)
#define CHUNK (ROW_LEN / CL)
#define NV4 (CHUNK / 4)
extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(BLOCK) rows({csig}) {{
    extern __shared__ float4 kf_chunk[];
    {shared}
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned rank = __clusterRelativeBlockRank();
    const size_t base = (size_t)blockIdx.y * ROW_LEN + (size_t)rank * CHUNK;
    const float4* xr4 = reinterpret_cast<const float4*>(X + base);
    float4* yr4 = reinterpret_cast<float4*>(Y + base);
    {op.declare()}
    #pragma unroll
    for (int c = threadIdx.x; c < NV4; c += BLOCK) {{  // NV4 and BLOCK are constants: unrolled, loads in flight
        float4 q = __ldg(xr4 + c);
        kf_chunk[c] = q;
        {acc4}
    }}
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
    if (lane == 0) {{ {save_w} }}
    __syncthreads();
    if (warp == 0) {{
        {load_w}
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
        if (lane == 0) {{ {bc_w} }}
    }}
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    {{
        {op.declare()}
        #pragma unroll
        for (int rk = 0; rk < CL; ++rk) {{ {remote} {op.merge} }}
        __cluster_barrier_arrive();  // no block leaves while another still reads its shared memory
        __cluster_barrier_wait();
        {op.final}
        #pragma unroll
        for (int c = threadIdx.x; c < NV4; c += BLOCK) {{
            float4 q = kf_chunk[c];
            const int j0 = (int)(rank * CHUNK) + c * 4;
            {out4}
            yr4[c] = q;
        }}
    }}
}}
"""
    wb = "self.m0.weight, self.m0.bias, " if spec.affine else ""
    forward = f"""
{_dims(spec)}
cl = _cluster(outer, R)
if cl and _aligned(x, y) and outer <= 65535:
    self._program(ROW_LEN=R, CL=cl).rows(x, {wb}y, outer, R, inner, 1, grid=(cl, outer, 1), block=(p['BLOCK'], 1, 1), shared_mem=R // cl * 4)
else:
    self._program(ROW_LEN=4, CL=1).rows_warp(x, {wb}y, outer, R, inner, int(R % 4 == 0 and _aligned(x)), grid=(_cdiv(outer * 32, 128), 1, 1), block=(128, 1, 1))
return y
"""
    return Recipe(
        f"{spec.family}/cluster_smem",
        spec.family,
        "cuda",
        kernel,
        forward,
        ["x"],
        TunableSpace(params={"BLOCK": [256, 512, 1024]}),
        {"BLOCK": 1024},
        rank=3 if _cluster_size(spec) else 1,  # below split_rows_vec on the H200 (5.92 vs 4.86 ms, 393216)
        modules=spec.modules,
        lazy=True,
        preamble=_CLUSTER_PY,
        description="a cluster of blocks per row, the row in shared memory, statistics merged through "
        "distributed shared memory: one read and one write",
    )


def _cluster_stream(spec: OpSpec, op: RowOp, sig: str, warp: str) -> Recipe:
    """Persistent clusters of CL blocks (sm_90), each block holding its CL-th of a row in shared memory
    (its float4 slots private to the thread that loads them). A cluster takes rows one after another
    (the first from its grid index, then from an atomic counter): while it writes row r from shared
    memory it already loads row r + 1 into the slots it frees, UNROLL float4 loads in flight per thread, so
    reads and writes overlap and the row is read once. One cluster barrier per row: the row's partial
    statistics (and the next row's number) sit in double-buffered shared slots read through distributed
    shared memory. Rows that do not split into float4 chunks of at most 200 KB run the warp kernel."""
    names = [n for n, _ in op.stats]
    parts = _cluster_parts(op, "[2]", "[buf]")
    shared, out4 = parts[1], f"{{ {parts[6]} }}"
    csig = sig.replace("int inner", "int inner, int* __restrict__ counter")
    kernel = f"""{warp.replace("void rows(", "void rows_warp(")}
// ROW_LEN (the row length), CL (blocks per row), BLOCK and UNROLL are defined when the program is built
#define NWARPS (BLOCK / 32)
#define CHUNK (ROW_LEN / CL)
#define NV4 (CHUNK / 4)
#define PER ((NV4 + BLOCK - 1) / BLOCK)
extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(BLOCK) rows({csig}) {{
    extern __shared__ float4 kf_chunk[];
    {shared}
    __shared__ int sh_next[2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned rank = __clusterRelativeBlockRank();
    int row = blockIdx.y;  // the same for every block of the cluster
    if (row >= outer) return;
    {op.declare()}
    {{
        const float4* xr4 = reinterpret_cast<const float4*>(X + (size_t)row * ROW_LEN + (size_t)rank * CHUNK);
        #pragma unroll
        for (int k0 = 0; k0 < PER; k0 += UNROLL) {{
            float4 qn[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {{
                const int c = threadIdx.x + (k0 + u) * BLOCK;
                if (k0 + u < PER && c < NV4) qn[u] = __ldg(xr4 + c);
            }}
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {{
                const int c = threadIdx.x + (k0 + u) * BLOCK;
                if (k0 + u < PER && c < NV4) {{ const float4 q = qn[u]; kf_chunk[c] = q; {op.acc4} }}
            }}
        }}
    }}
    for (int buf = 0;; buf ^= 1) {{
        {cluster_partials(op, parts)}
        {{
            {cluster_totals(op, parts)}
            float4* yr4 = reinterpret_cast<float4*>(Y + (size_t)row * ROW_LEN + (size_t)rank * CHUNK);
            const float4* xn4 = reinterpret_cast<const float4*>(X + (size_t)(more ? next : row) * ROW_LEN + (size_t)rank * CHUNK);
            {{
                {" ".join(f"{n}_s = {init};" for n, init in op.stats)}
            }}
            #pragma unroll
            for (int k0 = 0; k0 < PER; k0 += UNROLL) {{
                float4 qn[UNROLL];
                #pragma unroll
                for (int u = 0; u < UNROLL; ++u) {{  // the next row's loads first: in flight while this row is written
                    const int c = threadIdx.x + (k0 + u) * BLOCK;
                    if (more && k0 + u < PER && c < NV4) qn[u] = __ldg(xn4 + c);
                }}
                #pragma unroll
                for (int u = 0; u < UNROLL; ++u) {{
                    const int c = threadIdx.x + (k0 + u) * BLOCK;
                    if (k0 + u < PER && c < NV4) {{
                        float4 q = kf_chunk[c];
                        const int j0 = (int)(rank * CHUNK) + c * 4;
                        {out4}
                        yr4[c] = q;
                        if (more) {{
                            q = qn[u];
                            kf_chunk[c] = q;
                            {{ {" ".join(f"float {n} = {n}_s;" for n in names)} {op.acc4} {" ".join(f"{n}_s = {n};" for n in names)} }}
                        }}
                    }}
                }}
            }}
            if (!more) break;
            row = next;
        }}
        {" ".join(f"{n} = {n}_s;" for n in names)}
    }}
    __cluster_barrier_arrive();  // no block leaves while another may still read its shared memory
    __cluster_barrier_wait();
}}
"""
    # the next row's statistics live in <name>_s (declared once, outside the row loop)
    kernel = kernel.replace(
        "    __shared__ int sh_next[2];\n",
        "    __shared__ int sh_next[2];\n    " + op.declare("_s") + "\n",
        1,
    )
    wb = "self.m0.weight, self.m0.bias, " if spec.affine else ""
    forward = f"""
{_dims(spec)}
cl = _cluster(outer, R)
if cl and _aligned(x, y):
    counter = torch.zeros(1, dtype=torch.int32, device=x.device)
    prog = self._program(ROW_LEN=R, CL=cl, UNROLL=p['UNROLL'])
    per_sm = max(1, min(2048 // p['BLOCK'], 227 * 1024 // (R // cl * 4 + 1024)))  # resident blocks per SM
    prog.rows(x, {wb}y, outer, R, inner, counter, grid=(cl, max(1, min(outer, 65535, _SMS * per_sm // cl)), 1), block=(p['BLOCK'], 1, 1), shared_mem=R // cl * 4)
else:
    self._program(ROW_LEN=4, CL=1, UNROLL=1).rows_warp(x, {wb}y, outer, R, inner, int(R % 4 == 0 and _aligned(x)), grid=(_cdiv(outer * 32, 128), 1, 1), block=(128, 1, 1))
return y
"""
    # first where a row needs more than a block's share of an SM and splits over a cluster; where it does not
    # split, the warp kernel runs (slow for long rows)
    cl = _cluster_size(spec)
    rank = (5 if spec.R * 4 > 64 * 1024 else 3) if cl else 1
    return Recipe(
        f"{spec.family}/cluster_stream",
        spec.family,
        "cuda",
        kernel,
        forward,
        ["x"],
        TunableSpace(params={"BLOCK": [256, 512, 1024], "UNROLL": [2, 4, 8]}),
        # measured on the H200 (4096 x 393216, session 13): 1024 x 4 took softmax from 4.80 to 4.64 ms and
        # log-softmax from 4.39 to 3.77 (one block of 196 KB per SM: its warps are the only latency cover)
        {"BLOCK": 1024, "UNROLL": 4},
        rank=rank,
        modules=spec.modules,
        lazy=True,
        preamble=_CLUSTER_PY
        + "\n#: the GPU's SMs (the H200's): the persistent grid holds the clusters that are resident at once\n_SMS = 132\n",
        description="persistent clusters, a row in shared memory, the next row loaded while this one is "
        "written: one read and one write, reads and writes overlapped",
    )


def split_rows(spec: OpSpec, language: str) -> Recipe | None:
    """Rows split into SPLIT chunks across work-groups (for few long rows): kernel 1 writes each chunk's
    statistics, kernel 2 merges a row's partials in every work-group and writes its chunk."""
    if spec.inner != 1:
        return None
    op = row_op(spec, language)
    names = [n for n, _ in op.stats]
    k = len(names)
    g = "__global const float* restrict"
    wb = f"{g} w, {g} b, " if spec.affine else ""
    shared = "\n    ".join(f"__local float sh_{n}[BR];" for n in names)
    save = " ".join(f"sh_{n}[tr] = {n};" for n in names)
    load_o = " ".join(f"float {n}_o = sh_{n}[tr + s];" for n in names)
    put = " ".join(f"P[((long)o * SPLIT + chunk) * {k} + {i}] = {n};" for i, n in enumerate(names))
    get = " ".join(f"float {n}_o = P[((long)o * SPLIT + c) * {k} + {i}];" for i, n in enumerate(names))
    head = """    int tr = get_local_id(0), chunk = get_group_id(0), o = get_group_id(1);
    int per = (R + SPLIT - 1) / SPLIT;
    int r0 = chunk * per, r1 = min(R, r0 + per);
    __global const float* xr = X + (long)o * R;"""
    write = (
        f"if (chunk == 0 && tr == 0) Y[o] = {op.result};"
        if op.reduce
        else f"__global float* yr = Y + (long)o * R;\n    for (int r = r0 + tr; r < r1; r += BR) "
        f"{{ float x = xr[r]; int j = r; yr[r] = {op.out}; }}"
    )
    kernel = f"""
__kernel void rows_partial({g} X, __global float* restrict P, int outer, int R, int inner) {{
    {shared}
{head}
    {op.declare()}
    for (int r = r0 + tr; r < r1; r += BR) {{ float x = xr[r]; {op.acc} }}
    {save}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = BR / 2; s > 0; s >>= 1) {{
        if (tr < s) {{ {load_o} {op.merge} {save} }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    if (tr == 0) {{ {" ".join(f"{n} = sh_{n}[0];" for n in names)} {put} }}
}}

__kernel void rows({g} X, {wb}__global float* restrict Y, {g} P, int outer, int R, int inner) {{
{head}
    {op.declare()}
    for (int c = 0; c < SPLIT; ++c) {{ {get} {op.merge} }}
    {op.final}
    {write}
}}
"""
    if language == "cuda":
        kernel = to_cuda(kernel).replace("min(R, r0 + per)", "min(R, r0 + per)")
    wbp = "self.m0.weight, self.m0.bias, " if spec.affine else ""
    forward = f"""
{_dims(spec)}
part = torch.empty((outer, p['SPLIT'], {k}), dtype=x.dtype, device=x.device)
self.prog.rows_partial(x, part, outer, R, 1, grid=(p['SPLIT'], outer, 1), block=(p['BR'], 1, 1))
self.prog.rows(x, {wbp}y, part, outer, R, 1, grid=(p['SPLIT'], outer, 1), block=(p['BR'], 1, 1))
return y
"""
    brs = [16, 32, 64, 128] if language == "opencl" else [128, 256, 512, 1024]
    splits = [s for s in (2, 4, 8, 16, 32, 64) if s * 32 <= spec.R] or [2]
    return Recipe(
        f"{spec.family}/split_rows",
        spec.family,
        language,
        kernel,
        forward,
        ["x"],
        TunableSpace(params={"SPLIT": splits, "BR": brs}),
        {"SPLIT": splits[min(2, len(splits) - 1)], "BR": brs[1]},
        rank=3,
        modules=spec.modules,
        description="each row split across SPLIT work-groups: partial statistics, then merge and write",
    )


def inner_vector(spec: OpSpec, language: str) -> Recipe | None:
    """Reductions over a non-last dimension (and RMS norm there): VW neighbouring columns per work-item,
    vector loads along the contiguous inner dimension, statistics in vector registers. The last group of
    a row (inner % VW columns), and on CUDA any input whose rows are not 16-byte aligned, go scalar."""
    if spec.inner == 1 or spec.family not in ("reduce", "rms_norm"):
        return None
    vws = [2, 4, 8] if language == "opencl" else [4]
    op = spec.reduce_op if spec.family == "reduce" else "sumsq"
    init = {"max": "-INFINITY", "min": "INFINITY", "prod": "1.0f"}.get(op, "0.0f")
    R = "(float)R"
    eps = f"{spec.eps!r}f"
    # one scalar column (the tail and the unaligned path)
    sstep = (
        {
            "max": "a = (v > a || v != v) ? v : a;",
            "min": "a = (v < a || v != v) ? v : a;",
            "sumsq": "a += v * v;",
            "prod": "a *= v;",
        }[op]
        if op in ("max", "min", "sumsq", "prod")
        else "a += v;"
    )
    if spec.family == "reduce":
        sout = f"Y[(long)o * inner + col] = {'a / ' + R if op == 'mean' else 'a'};"
    else:
        sout = (
            f"float rs = rsqrt(a / {R} + {eps});\n"
            "            for (int r = 0; r < R; ++r) Y[((long)o * R + r) * inner + col] = X[((long)o * R + r) * inner + col] * rs;"
        )
    scalar_cols = f"""for (int col = iv * VW; col < min(inner, iv * VW + VW); ++col) {{
            float a = {init};
            for (int r = 0; r < R; ++r) {{ float v = X[((long)o * R + r) * inner + col]; {sstep} }}
            {sout}
        }}"""
    if language == "opencl":
        step = {
            "max": "acc = (v > acc || v != v) ? v : acc;",
            "min": "acc = (v < acc || v != v) ? v : acc;",
            "sumsq": "acc += v * v;",
            "prod": "acc *= v;",
        }.get(op, "acc += v;")
        if spec.family == "reduce":
            result = "acc / (floatv)(" + R + ")" if op == "mean" else "acc"
            tail = f"VSTOREV({result}, 0, Y + (long)o * inner + iv * VW);"
        else:
            tail = (
                f"floatv rstd = rsqrt(acc / (floatv)({R}) + (floatv)({eps}));\n"
                "    for (int r = 0; r < R; ++r) VSTOREV(VLOADV(0, xr + (long)r * inner) * rstd, 0, "
                "Y + (long)o * R * inner + (long)r * inner + iv * VW);"
            )
        kernel = f"""{OPENCL_VECTOR_HELPERS}
__kernel void rows(__global const float* restrict X, __global float* restrict Y, int outer, int R, int inner) {{
    int groups = (inner + VW - 1) / VW;
    int g = get_global_id(0);
    if (g >= outer * groups) return;
    int iv = g % groups, o = g / groups;
    if (iv * VW + VW > inner) {{
        {scalar_cols}
        return;
    }}
    __global const float* xr = X + (long)o * R * inner + iv * VW;
    floatv acc = (floatv)({init});
    for (int r = 0; r < R; ++r) {{ floatv v = VLOADV(0, xr + (long)r * inner); {step} }}
    {tail}
}}
"""
    else:
        comps = "xyzw"
        step = {
            "max": "acc.{c} = (v.{c} > acc.{c} || v.{c} != v.{c}) ? v.{c} : acc.{c};",
            "min": "acc.{c} = (v.{c} < acc.{c} || v.{c} != v.{c}) ? v.{c} : acc.{c};",
            "sumsq": "acc.{c} = fmaf(v.{c}, v.{c}, acc.{c});",
            "prod": "acc.{c} *= v.{c};",
        }.get(op, "acc.{c} += v.{c};")
        steps = " ".join(step.format(c=c) for c in comps)
        if spec.family == "reduce":
            scale = " / " + R if op == "mean" else ""
            tail = (
                "reinterpret_cast<float4*>(Y + (size_t)o * inner)[iv] = make_float4("
                + ", ".join(f"acc.{c}{scale}" for c in comps)
                + ");"
            )
        else:
            rstd = " ".join(f"float r{c} = rsqrtf(acc.{c} / {R} + {eps});" for c in comps)
            tail = (
                f"{rstd}\n    for (int r = 0; r < R; ++r) {{ float4 v = __ldg(reinterpret_cast<const float4*>"
                "(xr + (size_t)r * inner)); reinterpret_cast<float4*>(Y + (size_t)o * R * inner + (size_t)r * inner)"
                "[iv] = make_float4(v.x * rx, v.y * ry, v.z * rz, v.w * rw); }"
            )
        kernel = f"""
#define VW 4
extern "C" __global__ void rows(const float* __restrict__ X, float* __restrict__ Y, int outer, int R, int inner,
                                int vec4) {{
    // vec4: inner % 4 == 0 and X, Y 16-byte aligned (decided in forward); otherwise 4 scalar columns
    int groups = (inner + 3) / 4;
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= outer * groups) return;
    int iv = g % groups, o = g / groups;
    if (!vec4) {{
        {scalar_cols.replace("rsqrt(", "rsqrtf(").replace("(long)", "(size_t)")}
        return;
    }}
    const float* xr = X + (size_t)o * R * inner + iv * 4;
    float4 acc = make_float4({init}, {init}, {init}, {init});
    for (int r = 0; r < R; ++r) {{ float4 v = __ldg(reinterpret_cast<const float4*>(xr + (size_t)r * inner)); {steps} }}
    {tail}
}}
"""
    vw = "p['VW']" if language == "opencl" else "4"
    extra = "" if language == "opencl" else ", int(inner % 4 == 0 and _aligned(x, y))"
    params = (
        {"VW": vws, "BLOCK_X": [1, 4, 16, 64]} if language == "opencl" else {"BLOCK_X": [64, 128, 256, 512]}
    )
    defaults: dict[str, ParamValue] = (
        {"VW": vws[-1], "BLOCK_X": 4} if language == "opencl" else {"BLOCK_X": 256}
    )
    return Recipe(
        f"{spec.family}/inner_vector",
        spec.family,
        language,
        kernel,
        _forward(
            spec,
            f"(_cdiv(outer * _cdiv(inner, {vw}), p['BLOCK_X']), 1, 1)",
            "(p['BLOCK_X'], 1, 1)",
            extra=extra,
        ),
        ["x"],
        TunableSpace(params=params),
        defaults,
        rank=2,
        modules=spec.modules,
        description="vector loads along the contiguous inner dimension, statistics in vector registers",
        sycl_ok=op not in ("max", "min"),
    )


def split_rows_vec(spec: OpSpec) -> Recipe | None:
    """CUDA, rows along the last dimension split across ``split`` blocks each (``split`` computed in
    ``forward`` for about eight blocks per SM): kernel 1 folds each chunk with float4 loads (four in
    flight per thread) into partial statistics, merged by warp shuffles and shared memory; kernel 2
    merges a row's partials in one warp and writes its chunk with float4 loads (four in flight) and stores, the chunks
    in reverse order (the last ones read are still in L2). Scalar where rows are not 16-byte aligned."""
    if spec.inner != 1:
        return None
    op = row_op(spec, "cuda")
    names = [n for n, _ in op.stats]
    k = len(names)
    c = "const float* __restrict__"
    wb = f"{c} w, {c} b, " if spec.affine else ""
    shared = "\n    ".join(f"__shared__ float sh_{n}[32];" for n in names)
    shfl = " ".join(f"float {n}_o = __shfl_xor_sync(0xffffffffu, {n}, off);" for n in names)
    save_w = " ".join(f"sh_{n}[warp] = {n};" for n in names)
    load_w = " ".join(f"{n} = lane < NWARPS ? sh_{n}[lane] : {init};" for n, init in op.stats)
    put = " ".join(f"P[((size_t)o * split + chunk) * {k} + {i}] = {n};" for i, n in enumerate(names))
    get = " ".join(f"float {n}_o = P[((size_t)o * split + q) * {k} + {i}];" for i, n in enumerate(names))
    bc = " ".join(f"sh_{n}[0] = {n};" for n in names)
    fetch = " ".join(f"{n} = sh_{n}[0];" for n in names)
    acc4 = op.acc4
    out4 = (
        f"float x; int j = 4 * ce; x = q.x; q.x = {op.out}; x = q.y; ++j; q.y = {op.out}; "
        f"x = q.z; ++j; q.z = {op.out}; x = q.w; ++j; q.w = {op.out};"
    )
    if spec.affine and "w[j]" in op.out and "b[j]" in op.out:
        # the affine parameters as float4 too (were two scalar loads per element)
        o = op.out.replace("w[j]", "wv").replace("b[j]", "bv")
        out4 = (
            "const float4 wq = __ldg(reinterpret_cast<const float4*>(w) + ce), "
            "bq = __ldg(reinterpret_cast<const float4*>(b) + ce); float x, wv, bv; "
            + " ".join(f"x = q.{c}; wv = wq.{c}; bv = bq.{c}; q.{c} = {o};" for c in "xyzw")
        )
    ranges = """const int R4 = R >> 2, per4 = (R4 + split - 1) / split;
        const int c0 = chunk * per4, c1 = min(R4, c0 + per4);"""
    sranges = """const int per = (R + split - 1) / split;
        const int r0 = chunk * per, r1 = min(R, r0 + per);"""
    if op.reduce:
        write = f"if (blockIdx.x == 0 && threadIdx.x == 0) Y[o] = {op.result};"
    else:
        write = f"""if (vec4) {{
        {ranges}
        const float4* x4 = reinterpret_cast<const float4*>(X + (size_t)o * R);
        float4* y4 = reinterpret_cast<float4*>(Y + (size_t)o * R);
        // each chunk from its end: kernel 1 read the chunks' ends last, so they may still be in L2; four
        // loads in flight per thread
        int cc = c1 - 1 - (int)threadIdx.x;
        for (; cc - 3 * BLOCK >= c0; cc -= 4 * BLOCK) {{
            float4 v[4];
            #pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = __ldg(x4 + cc - u * BLOCK);
            #pragma unroll
            for (int u = 0; u < 4; ++u) {{ const int ce = cc - u * BLOCK; float4 q = v[u]; {out4} y4[ce] = q; }}
        }}
        for (; cc >= c0; cc -= BLOCK) {{ const int ce = cc; float4 q = __ldg(x4 + cc); {out4} y4[cc] = q; }}
    }} else {{
        {sranges}
        for (int r = r0 + threadIdx.x; r < r1; r += BLOCK) {{ float x = __ldg(X + (size_t)o * R + r); int j = r; Y[(size_t)o * R + r] = {op.out}; }}
    }}"""
    # threads per SM the grid is sized for (one wave): 2048 where a kernel fits in 32 registers a thread;
    # layer norm's take 36-40 (sm_90), so 1280 (5 blocks of 256, up to 51 registers: no spill at 6): its
    # 16 x 4M rows took 1056 blocks for 792 slots, two waves with the second a third full
    tps = 1280 if k == 3 else 2048
    kernel = f"""
#define NWARPS (BLOCK / 32)
#define KF_MINB ({tps} / BLOCK > 0 ? {tps} / BLOCK : 1)
extern "C" __global__ void __launch_bounds__(BLOCK, KF_MINB) rows_partial({c} X, float* __restrict__ P, int outer, int R,
                                                                 int split, int vec4) {{
    {shared}
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunk = blockIdx.x, o = blockIdx.y;
    {op.declare()}
    if (vec4) {{
        {ranges}
        const float4* x4 = reinterpret_cast<const float4*>(X + (size_t)o * R);
        int cc = c0 + threadIdx.x;
        for (; cc + 3 * BLOCK < c1; cc += 4 * BLOCK) {{
            float4 v[4];
            #pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = __ldg(x4 + cc + u * BLOCK);
            #pragma unroll
            for (int u = 0; u < 4; ++u) {{ const float4 q = v[u]; {acc4} }}
        }}
        for (; cc < c1; cc += BLOCK) {{ const float4 q = __ldg(x4 + cc); {acc4} }}
    }} else {{
        {sranges}
        for (int r = r0 + threadIdx.x; r < r1; r += BLOCK) {{ float x = __ldg(X + (size_t)o * R + r); {op.acc} }}
    }}
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
    if (lane == 0) {{ {save_w} }}
    __syncthreads();
    if (warp == 0) {{
        {load_w}
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
        if (lane == 0) {{ {put} }}
    }}
}}

extern "C" __global__ void __launch_bounds__(BLOCK, KF_MINB) rows({c} X, {wb}float* __restrict__ Y, {c} P, int outer,
                                                         int R, int split, int vec4) {{
    {shared}
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunk = split - 1 - (int)blockIdx.x, o = outer - 1 - (int)blockIdx.y;
    {op.declare()}
    if (warp == 0) {{
        for (int q = lane; q < split; q += 32) {{ {get} {op.merge} }}
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) {{ {shfl} {op.merge} }}
        if (lane == 0) {{ {bc} }}
    }}
    __syncthreads();
    {fetch}
    {op.final}
    {write}
}}
"""
    wbp = "self.m0.weight, self.m0.bias, " if spec.affine else ""
    grid2 = "(1, outer, 1)" if op.reduce else "(split, outer, 1)"
    forward = f"""
{_dims(spec)}
vec4 = int(R % 4 == 0 and _aligned(x, y{", self.m0.weight, self.m0.bias" if spec.affine else ""}))
split = max(1, min(256, max(1, {tps} // p['BLOCK']) * 132 // outer, _cdiv(R, 16 * p['BLOCK'])))
part = torch.empty((outer, split, {k}), dtype=x.dtype, device=x.device)
self.prog.rows_partial(x, part, outer, R, split, vec4, grid=(split, outer, 1), block=(p['BLOCK'], 1, 1))
self.prog.rows(x, {wbp}y, part, outer, R, split, vec4, grid={grid2}, block=(p['BLOCK'], 1, 1))
return y
"""
    return Recipe(
        f"{spec.family}/split_rows_vec",
        spec.family,
        "cuda",
        kernel,
        forward,
        ["x"],
        TunableSpace(params={"BLOCK": [128, 256, 512, 1024]}),
        {"BLOCK": 256},
        rank=4,
        modules=spec.modules,
        description="rows split across blocks sized for the GPU: float4 partial statistics, then a "
        "warp merges them and the chunk is written with float4 (reverse order, L2 hits)",
    )


def inner_columns(spec: OpSpec) -> Recipe | None:
    """CUDA, rows along a non-last dimension (stride ``inner``): a thread per column, neighbouring
    threads on neighbouring columns (coalesced scalar loads). Rows of at most 64 (ROW_LEN, built per
    shape) stay in registers, loaded all at once: one read and one write; longer rows stream with eight
    loads in flight (a second read for the output of non-reductions)."""
    if spec.inner == 1:
        return None
    op = row_op(spec, "cuda")
    names = [n for n, _ in op.stats]
    sig = _sig(spec, "cuda")
    if op.reduce:
        cached_write = stream_write = f"Y[(size_t)o * inner + col] = {op.result};"
    else:
        cached_write = """#pragma unroll
        for (int r = 0; r < ROW_LEN; ++r) { float x = v[r]; int j = r; yr[(size_t)r * inner] = OUT; }""".replace(
            "OUT", op.out
        )
        stream_write = (
            "for (int r = 0; r < R; ++r) { float x = __ldg(xr + (size_t)r * inner); int j = r; "
            f"yr[(size_t)r * inner] = {op.out}; }}"
        )
    kernel = f"""
// ROW_LEN (the row length) is defined when the program is built for the input's shape
extern "C" __global__ void __launch_bounds__(BLOCK_X) rows({sig}) {{
    const long long col = (long long)blockIdx.x * BLOCK_X + threadIdx.x;
    if (col >= inner) return;
    for (int o = blockIdx.y; o < outer; o += gridDim.y) {{
        const float* xr = X + (size_t)o * R * inner + col;
        float* yr = Y + (size_t)o * {"1" if op.reduce else "R"} * inner + col;
#if ROW_LEN <= 64
        {op.declare()}
        float v[ROW_LEN];
        #pragma unroll
        for (int r = 0; r < ROW_LEN; ++r) v[r] = __ldg(xr + (size_t)r * inner);
        #pragma unroll
        for (int r = 0; r < ROW_LEN; ++r) {{ float x = v[r]; {op.acc} }}
        {op.final}
        {cached_write}
#else
        // statistics per chunk of 64 rows, merged into the running ones (_s): sums stay fp32-sound
        {op.declare("_s")}
        for (int r0 = 0; r0 < R; r0 += 64) {{
            {op.declare()}
            const int r1 = min(R, r0 + 64);
            #pragma unroll 8
            for (int r = r0; r < r1; ++r) {{ float x = __ldg(xr + (size_t)r * inner); {op.acc} }}
            {{ {" ".join(f"float {n}_o = {n}_s;" for n in names)} {op.merge} {" ".join(f"{n}_s = {n};" for n in names)} }}
        }}
        {{
            {" ".join(f"float {n} = {n}_s;" for n in names)}
            {op.final}
            {stream_write}
        }}
#endif
        (void)yr;
    }}
}}
"""
    return Recipe(
        f"{spec.family}/inner_columns",
        spec.family,
        "cuda",
        kernel,
        _forward(
            spec,
            "(_cdiv(inner, p['BLOCK_X']), min(outer, 65535), 1)",
            "(p['BLOCK_X'], 1, 1)",
            program="self._program(ROW_LEN=R)",
        ),
        ["x"],
        TunableSpace(params={"BLOCK_X": [64, 128, 256, 512]}),
        {"BLOCK_X": 128},
        rank=3,
        modules=spec.modules,
        lazy=True,
        description="a thread per column (coalesced), short rows kept in registers: one read",
    )


def inner_split(spec: OpSpec) -> Recipe | None:
    """CUDA, reductions (sum, mean, max, min) along a non-last dimension with many columns: each column's
    rows split into ``split`` ranges (``split`` from ``forward``: about eight resident threads' worth of
    work items per SM slot), a thread per (column, range) with eight loads in flight (summed in pairs),
    neighbouring threads on neighbouring columns; a second kernel folds a column's ``split`` partials."""
    if (
        spec.inner == 1
        or spec.family != "reduce"
        or spec.reduce_op not in ("sum", "mean", "max", "min", "prod")
    ):
        return None
    op = spec.reduce_op
    init = {"max": "-INFINITY", "min": "INFINITY", "prod": "1.0f"}.get(op, "0.0f")
    cmp = {"max": ">", "min": "<"}.get(op, "")
    comb = (
        (lambda a, b: f"{a} = ({b} {cmp} {a} || {b} != {b}) ? {b} : {a};")
        if cmp
        else (lambda a, b: f"{a} *= {b};")
        if op == "prod"
        else (lambda a, b: f"{a} += {b};")
    )
    if cmp:
        eight = " ".join(comb("a", f"v[{u}]") for u in range(8))
    elif op == "prod":
        eight = "a *= ((v[0] * v[1]) * (v[2] * v[3])) * ((v[4] * v[5]) * (v[6] * v[7]));"
    else:
        eight = "a += ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));"
    result = "a / (float)R" if op == "mean" else "a"
    keep = "1" if len(spec.output_shape) == len(spec.input_shapes[0]) else "0"
    kernel = f"""
extern "C" __global__ void __launch_bounds__(256) partial(const float* __restrict__ X, float* __restrict__ P,
                                                          int outer, int R, int inner, int split) {{
    const long long col = (long long)blockIdx.x * 256 + threadIdx.x;
    if (col >= inner) return;
    const int o = blockIdx.y, z = blockIdx.z, per = (R + split - 1) / split;
    const int r0 = z * per, r1 = min(R, r0 + per);
    const float* xr = X + (size_t)o * R * inner + col;
    float a = {init};
    int r = r0;
    for (; r + 8 <= r1; r += 8) {{  // eight loads in flight
        float v[8];
        #pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = __ldg(xr + (size_t)(r + u) * inner);
        {eight}
    }}
    for (; r < r1; ++r) {{ const float v = __ldg(xr + (size_t)r * inner); {comb("a", "v")} }}
    P[((size_t)z * outer + o) * inner + col] = a;
}}

extern "C" __global__ void __launch_bounds__(256) rows(const float* __restrict__ P, float* __restrict__ Y, int outer,
                                                       int R, int inner, int split) {{
    const long long g = (long long)blockIdx.x * 256 + threadIdx.x;
    if (g >= (long long)outer * inner) return;
    float a = {init};
    for (int z = 0; z < split; ++z) {{ const float v = P[(size_t)z * outer * inner + g]; {comb("a", "v")} }}
    Y[g] = {result};
}}
"""
    forward = f"""
outer, R, inner = _prod(x.shape[:{spec.dim}]), x.shape[{spec.dim}], _prod(x.shape[{spec.dim + 1}:])
y = torch.empty(x.shape[:{spec.dim}] + ((1,) if {keep} else ()) + x.shape[{spec.dim + 1}:], dtype=x.dtype, device=x.device)
split = max(1, min(R // 64, _cdiv(p['WAVES'] * 132 * 2048, max(1, outer * inner)), 65535))
part = torch.empty((split, outer, inner), dtype=x.dtype, device=x.device)
self.prog.partial(x, part, outer, R, inner, split, grid=(_cdiv(inner, 256), outer, split), block=(256, 1, 1))
self.prog.rows(part, y, outer, R, inner, split, grid=(_cdiv(outer * inner, 256), 1, 1), block=(256, 1, 1))
return y
"""
    return Recipe(
        f"{spec.family}/inner_split",
        spec.family,
        "cuda",
        kernel,
        forward,
        ["x"],
        TunableSpace(params={"WAVES": [2, 4, 8]}),
        {"WAVES": 4},
        # large inputs only: a small one is bound by the launches (this takes two)
        rank=4 if spec.outer <= 65535 and spec.outer * spec.R * spec.inner >= 1 << 24 else 1,
        modules=spec.modules,
        description="rows split into ranges for more threads, eight loads in flight per thread, then the "
        "ranges' partials folded",
    )


def gemv_rows(spec: OpSpec) -> Recipe | None:
    """CUDA matrix times a column vector (no bias or epilogue), each row a dot product: KS warps per row
    split K (so that short or few rows still fill the GPU), eight float4 loads of the row and of the vector
    in flight per lane (their products summed per batch), warp shuffles, then the row's KS partials in
    shared memory. Scalar where K % 4 != 0 or A, B are not 16-byte aligned."""
    if (
        spec.family != "matmul"
        or spec.N != 1
        or spec.linear
        or spec.bias
        or spec.expr is not None
        or spec.dtype != "float32"
        or [len(s) for s in spec.input_shapes] != [2, 2]
    ):
        return None
    dot = "fmaf(x[u].x, y[u].x, fmaf(x[u].y, y[u].y, fmaf(x[u].z, y[u].z, x[u].w * y[u].w)))"
    kernel = f"""
#define WARPS (BLOCK / 32)
#define RB (WARPS / KS)
extern "C" __global__ void __launch_bounds__(BLOCK) gemv(const float* __restrict__ A, const float* __restrict__ B,
                                                         float* __restrict__ C, int M, int K) {{
    __shared__ float part[WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = blockIdx.x * RB + warp / KS, ks = warp % KS;
    float acc = 0.0f;
    if (r < M) {{
        const float* a = A + (size_t)r * K;
        if ((K & 3) == 0 && (reinterpret_cast<size_t>(A) & 15) == 0 && (reinterpret_cast<size_t>(B) & 15) == 0) {{
            const int K4 = K >> 2, per = (K4 + KS - 1) / KS, c0 = ks * per, c1 = min(K4, c0 + per);
            const float4* a4 = reinterpret_cast<const float4*>(a);
            const float4* b4 = reinterpret_cast<const float4*>(B);
            int c = c0 + lane;
            for (; c + 7 * 32 < c1; c += 8 * 32) {{  // eight loads of A (and of B) in flight per lane
                float4 x[8], y[8];
                #pragma unroll
                for (int u = 0; u < 8; ++u) {{ x[u] = __ldg(a4 + c + 32 * u); y[u] = __ldg(b4 + c + 32 * u); }}
                float s[8];
                #pragma unroll
                for (int u = 0; u < 8; ++u) s[u] = {dot};
                acc += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
            }}
            for (; c < c1; c += 32) {{
                const float4 x0 = __ldg(a4 + c), y0 = __ldg(b4 + c);
                acc += fmaf(x0.x, y0.x, fmaf(x0.y, y0.y, fmaf(x0.z, y0.z, x0.w * y0.w)));
            }}
        }} else {{
            const int per = (K + KS - 1) / KS, k0 = ks * per, k1 = min(K, k0 + per);
            for (int q0 = k0; q0 < k1; q0 += 32 * 64) {{  // partial sums per 64 terms of a lane
                float s = 0.0f;
                const int q1 = min(k1, q0 + 32 * 64);
                for (int k = q0 + lane; k < q1; k += 32) s = fmaf(__ldg(a + k), __ldg(B + k), s);
                acc += s;
            }}
        }}
    }}
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (threadIdx.x < RB) {{
        const int row = blockIdx.x * RB + threadIdx.x;
        float t = 0.0f;
        #pragma unroll
        for (int q = 0; q < KS; ++q) t += part[threadIdx.x * KS + q];
        if (row < M) C[row] = t;
    }}
}}
"""
    forward = """
M, K = a.shape
c = torch.empty((M, 1), dtype=a.dtype, device=a.device)
self.prog.gemv(a, b, c, M, K, grid=(max(1, _cdiv(M, p['BLOCK'] // 32 // p['KS'])), 1, 1), block=(p['BLOCK'], 1, 1))
return c
"""
    recipe = Recipe(
        "matmul/gemv_rows",
        "matmul",
        "cuda",
        kernel,
        forward,
        ["a", "b"],
        TunableSpace(
            params={"BLOCK": [128, 256, 512], "KS": [1, 2, 4, 8]}, restrictions=["BLOCK // 32 % KS == 0"]
        ),
        {"BLOCK": 256, "KS": 4},
        rank=5,
        modules=spec.modules,
        description="a dot product per row, K split over a few warps, eight float4 loads in flight per "
        "lane, warp shuffles and shared memory",
    )
    return adapt([recipe], spec)[0]


def recipes(spec: OpSpec, language: str) -> list[Recipe]:
    out = opencl_recipes(spec) if language == "opencl" else cuda_recipes(spec)
    extra = [split_rows(spec, language), inner_vector(spec, language)]
    if language == "cuda":
        extra += [split_rows_vec(spec), inner_columns(spec), inner_split(spec)]
        from kfoundry.plugins.llms.offline.cookbook_rows_onchip import onchip_split  # noqa: PLC0415

        extra.append(onchip_split(spec))  # long rows on chip: one read, one write (issue 13)
    return adapt(out + [r for r in extra if r is not None], spec)
