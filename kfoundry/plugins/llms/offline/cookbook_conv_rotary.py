"""Depthwise 2-D convolution and rotary-embedding recipes.

Depthwise convolution: one output per work-item → a row strip of outputs per work-item with the
filter held in registers → a work-group tile whose input patch (with halo) is staged in local memory
→ a column strip per work-item (consecutive work-items on consecutive columns: coalesced), each input
row its outputs' taps share loaded once.
Rotary embedding (rotate-half form): one pair per work-item → vector loads of both halves → one
(position, column) per work-item looping over the heads so cos/sin are loaded once.
Scalar kernels are written once in OpenCL C and translated to CUDA (:func:`to_cuda`).
"""

from __future__ import annotations

from kfoundry.core.models import TunableSpace
from kfoundry.plugins.llms.offline.index_width import adapt
from kfoundry.plugins.llms.offline.recipe import OPENCL_VECTOR_HELPERS, Recipe, to_cuda
from kfoundry.plugins.llms.offline.recognize import OpSpec

#: The filter geometry is compiled in (D_KS, D_STRIDE, D_PAD, read from the module in __init__), and so
#: are the sizes (D_N, D_C, D_H, D_W, D_OH, D_OW): read from the input in forward, one build per shape
#: (as runtime arguments the strip kernel ran 2.6x slower on PoCL).
_CONV_DEFINES = '{"D_KS": self.m0.kernel_size[0], "D_STRIDE": self.m0.stride[0], "D_PAD": self.m0.padding[0]}'


def _conv_forward(spec: OpSpec, grid: str, block: str) -> str:
    bias = "self.m0.bias, " if spec.bias else ""
    return f"""
        N, C, H, W = x.shape
        ks, st, pad = self.m0.kernel_size[0], self.m0.stride[0], self.m0.padding[0]
        OH, OW = (H + 2 * pad - ks) // st + 1, (W + 2 * pad - ks) // st + 1
        y = torch.empty((N, C, OH, OW), dtype=x.dtype, device=x.device)
        prog = self._program(D_N=N, D_C=C, D_H=H, D_W=W, D_OH=OH, D_OW=OW)
        prog.dwconv(x, self.m0.weight, {bias}y, grid={grid}, block={block})
        return y
    """


def conv_recipes(spec: OpSpec, language: str) -> list[Recipe]:
    bias_arg = "__global const float* restrict bias, " if spec.bias else ""
    bias_add = " + bias[c]" if spec.bias else ""
    sig = (
        f"__global const float* restrict X, __global const float* restrict Wt, {bias_arg}"
        "__global float* restrict Y"
    )
    pre = ""
    naive = f"""{pre}
__kernel void dwconv({sig}) {{
    int ow = get_global_id(0), oh = get_global_id(1), nc = get_global_id(2);
    if (ow >= D_OW || oh >= D_OH || nc >= D_N * D_C) return;
    int c = nc % D_C;
    float acc = 0.0f;
    for (int i = 0; i < D_KS; ++i)
        for (int j = 0; j < D_KS; ++j) {{
            int ih = oh * D_STRIDE - D_PAD + i, iw = ow * D_STRIDE - D_PAD + j;
            if (ih >= 0 && ih < D_H && iw >= 0 && iw < D_W)
                acc += X[((long)nc * D_H + ih) * D_W + iw] * Wt[(c * D_KS + i) * D_KS + j];
        }}
    Y[((long)nc * D_OH + oh) * D_OW + ow] = acc{bias_add};
}}
"""
    strip = f"""{pre}
__kernel void dwconv({sig}) {{
    int ow0 = get_global_id(0) * OWT, oh = get_global_id(1), nc = get_global_id(2);
    if (ow0 >= D_OW || oh >= D_OH || nc >= D_N * D_C) return;
    int c = nc % D_C;
    float wreg[D_KS * D_KS];
    #pragma unroll
    for (int k = 0; k < D_KS * D_KS; ++k) wreg[k] = Wt[c * D_KS * D_KS + k];
    float acc[OWT];
    #pragma unroll
    for (int t = 0; t < OWT; ++t) acc[t] = 0.0f;
    for (int i = 0; i < D_KS; ++i) {{
        int ih = oh * D_STRIDE - D_PAD + i;
        if (ih < 0 || ih >= D_H) continue;
        __global const float* row = X + ((long)nc * D_H + ih) * D_W;
        #pragma unroll
        for (int j = 0; j < D_KS; ++j)
            #pragma unroll
            for (int t = 0; t < OWT; ++t) {{
                int iw = (ow0 + t) * D_STRIDE - D_PAD + j;
                float v = (iw >= 0 && iw < D_W) ? row[iw] : 0.0f;
                acc[t] += v * wreg[i * D_KS + j];
            }}
    }}
    #pragma unroll
    for (int t = 0; t < OWT; ++t)
        if (ow0 + t < D_OW) Y[((long)nc * D_OH + oh) * D_OW + ow0 + t] = acc[t]{bias_add};
}}
"""
    tile = f"""{pre}
#define IN_TW ((TILE_X - 1) * D_STRIDE + D_KS)
#define IN_TH ((TILE_Y - 1) * D_STRIDE + D_KS)
__kernel void dwconv({sig}) {{
    __local float patch[IN_TH][IN_TW];
    int tx = get_local_id(0), ty = get_local_id(1), nc = get_group_id(2);
    int ow = get_group_id(0) * TILE_X + tx, oh = get_group_id(1) * TILE_Y + ty;
    int c = nc % D_C;
    int ih0 = get_group_id(1) * TILE_Y * D_STRIDE - D_PAD, iw0 = get_group_id(0) * TILE_X * D_STRIDE - D_PAD;
    for (int e = ty * TILE_X + tx; e < IN_TH * IN_TW; e += TILE_X * TILE_Y) {{
        int r = e / IN_TW, q = e % IN_TW, ih = ih0 + r, iw = iw0 + q;
        patch[r][q] = (ih >= 0 && ih < D_H && iw >= 0 && iw < D_W) ? X[((long)nc * D_H + ih) * D_W + iw] : 0.0f;
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
    if (ow >= D_OW || oh >= D_OH) return;
    float acc = 0.0f;
    for (int i = 0; i < D_KS; ++i)
        for (int j = 0; j < D_KS; ++j)
            acc += patch[ty * D_STRIDE + i][tx * D_STRIDE + j] * Wt[(c * D_KS + i) * D_KS + j];
    Y[((long)nc * D_OH + oh) * D_OW + ow] = acc{bias_add};
}}
"""
    column = f"""{pre}
#define SPAN ((ROWS - 1) * D_STRIDE + D_KS)
__kernel void dwconv({sig}) {{
    int ow = get_global_id(0), oh0 = get_global_id(1) * ROWS, nc = get_global_id(2);
    if (ow >= D_OW || oh0 >= D_OH || nc >= D_N * D_C) return;
    int c = nc % D_C;
    float wreg[D_KS * D_KS];
    #pragma unroll
    for (int k = 0; k < D_KS * D_KS; ++k) wreg[k] = Wt[c * D_KS * D_KS + k];
    float acc[ROWS];
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    __global const float* plane = X + (long)nc * D_H * D_W;
    #pragma unroll
    for (int q = 0; q < SPAN; ++q) {{
        int ih = oh0 * D_STRIDE - D_PAD + q;
        if (ih < 0 || ih >= D_H) continue;
        float v[D_KS];
        #pragma unroll
        for (int j = 0; j < D_KS; ++j) {{
            int iw = ow * D_STRIDE - D_PAD + j;
            v[j] = (iw >= 0 && iw < D_W) ? plane[ih * D_W + iw] : 0.0f;
        }}
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) {{
            int i = q - r * D_STRIDE;
            if (i >= 0 && i < D_KS) {{
                #pragma unroll
                for (int j = 0; j < D_KS; ++j) acc[r] += v[j] * wreg[i * D_KS + j];
            }}
        }}
    }}
    #pragma unroll
    for (int r = 0; r < ROWS; ++r)
        if (oh0 + r < D_OH) Y[((long)nc * D_OH + oh0 + r) * D_OW + ow] = acc[r]{bias_add};
}}
"""
    nc = "N * C"
    conv = (lambda s: s) if language == "opencl" else to_cuda
    blocks = [1, 2, 4, 8, 16, 32] if language == "opencl" else [8, 16, 32, 64]
    out = [
        Recipe(
            "depthwise_conv2d/naive",
            "depthwise_conv2d",
            language,
            conv(naive),
            _conv_forward(
                spec,
                f"(_cdiv(OW, p['BLOCK_X']), _cdiv(OH, p['BLOCK_Y']), {nc})",
                "(p['BLOCK_X'], p['BLOCK_Y'], 1)",
            ),
            ["x"],
            TunableSpace(
                params={"BLOCK_X": blocks, "BLOCK_Y": [1, 2, 4, 8]},
                restrictions=["BLOCK_X * BLOCK_Y <= 1024"],
            ),
            {"BLOCK_X": 16 if language == "opencl" else 32, "BLOCK_Y": 4},
            rank=0,
            modules=spec.modules,
            init_defines=_CONV_DEFINES,
            lazy=True,
            description="one output per work-item",
        ),
        Recipe(
            "depthwise_conv2d/register_strip",
            "depthwise_conv2d",
            language,
            conv(strip),
            _conv_forward(
                spec,
                f"(_cdiv(_cdiv(OW, p['OWT']), p['BLOCK_X']), _cdiv(OH, p['BLOCK_Y']), {nc})",
                "(p['BLOCK_X'], p['BLOCK_Y'], 1)",
            ),
            ["x"],
            TunableSpace(
                params={"OWT": [2, 4, 8, 16], "BLOCK_X": blocks, "BLOCK_Y": [1, 2, 4, 8]},
                restrictions=["BLOCK_X * BLOCK_Y <= 1024"],
            ),
            {"OWT": 8, "BLOCK_X": 4 if language == "opencl" else 32, "BLOCK_Y": 4},
            rank=1,
            modules=spec.modules,
            init_defines=_CONV_DEFINES,
            lazy=True,
            description="a strip of OWT outputs per work-item, the filter in registers",
        ),
        Recipe(
            "depthwise_conv2d/local_tile",
            "depthwise_conv2d",
            language,
            conv(tile),
            _conv_forward(
                spec,
                f"(_cdiv(OW, p['TILE_X']), _cdiv(OH, p['TILE_Y']), {nc})",
                "(p['TILE_X'], p['TILE_Y'], 1)",
            ),
            ["x"],
            TunableSpace(
                params={"TILE_X": [8, 16, 32], "TILE_Y": [2, 4, 8, 16]},
                restrictions=["TILE_X * TILE_Y <= 1024"],
            ),
            {"TILE_X": 16 if language == "opencl" else 32, "TILE_Y": 8},
            rank=2,
            modules=spec.modules,
            init_defines=_CONV_DEFINES,
            lazy=True,
            description="a work-group tile with its input patch and halo in local memory",
        ),
        Recipe(
            "depthwise_conv2d/column_strip",
            "depthwise_conv2d",
            language,
            conv(column),
            _conv_forward(
                spec,
                f"(_cdiv(OW, p['BLOCK_X']), _cdiv(_cdiv(OH, p['ROWS']), p['BLOCK_Y']), {nc})",
                "(p['BLOCK_X'], p['BLOCK_Y'], 1)",
            ),
            ["x"],
            TunableSpace(
                params={"ROWS": [2, 4, 8], "BLOCK_X": blocks, "BLOCK_Y": [1, 2, 4, 8]},
                restrictions=["BLOCK_X * BLOCK_Y <= 1024"],
            ),
            {"ROWS": 4, "BLOCK_X": 16 if language == "opencl" else 32, "BLOCK_Y": 8},
            rank=3,
            modules=spec.modules,
            init_defines=_CONV_DEFINES,
            lazy=True,
            description="a column strip of ROWS outputs per work-item (coalesced across the warp): the input "
            "rows its taps share loaded once, the filter in registers",
        ),
    ]
    return out


def _rot_forward(spec: OpSpec, grid: str, block: str, fallback: tuple[str, str] | None = None) -> str:
    """``forward``: x viewed as [outer, S, inner, 2 * half] (S on the axis cos/sin index), sizes from x.
    ``fallback`` (kernel, grid): run instead where half % 4 or 16-byte alignment rules out float4."""
    a = spec.dims["axis"]
    call = f"self.prog.rotary(x, cos, sin, y, outer, S, inner, half, grid={grid}, block={block})"
    if fallback is not None:
        call = (
            f"if half % 4 == 0 and _aligned(x, cos, sin, y):\n    {call}\nelse:\n"
            f"    self.prog.{fallback[0]}(x, cos, sin, y, outer, S, inner, half, grid={fallback[1]}, block={block})"
        )
    return f"""
outer, S, inner, half = _prod(x.shape[:{a}]), x.shape[{a}], _prod(x.shape[{a + 1}:-1]), x.shape[-1] // 2
pairs = outer * S * inner * half
y = torch.empty_like(x)
{call}
return y
"""


def rotary_recipes(spec: OpSpec, language: str) -> list[Recipe]:
    pre = ""
    sig = (
        "__global const float* restrict X, __global const float* restrict COS, "
        "__global const float* restrict SIN, __global float* restrict Y, int R_OUTER, int R_S, int R_INNER, "
        "int R_HALF"
    )
    naive = f"""{pre}
__kernel void rotary({sig}) {{
    int g = get_global_id(0);
    if (g >= R_OUTER * R_S * R_INNER * R_HALF) return;
    int j = g % R_HALF, rest = g / R_HALF;
    int s = (rest / R_INNER) % R_S;
    long base = (long)rest * (2 * R_HALF);
    float x1 = X[base + j], x2 = X[base + j + R_HALF];
    float c = COS[s * R_HALF + j], sn = SIN[s * R_HALF + j];
    Y[base + j] = x1 * c - x2 * sn;
    Y[base + j + R_HALF] = x2 * c + x1 * sn;
}}
"""
    heads = f"""{pre}
__kernel void rotary({sig}) {{
    // one (position, column) per work-item: cos/sin loaded once, reused over the heads
    int g = get_global_id(0);
    if (g >= R_OUTER * R_S * R_HALF) return;
    int j = g % R_HALF, os = g / R_HALF, s = os % R_S;
    float c = COS[s * R_HALF + j], sn = SIN[s * R_HALF + j];
    for (int h = 0; h < R_INNER; ++h) {{
        long base = ((long)os * R_INNER + h) * (2 * R_HALF);
        float x1 = X[base + j], x2 = X[base + j + R_HALF];
        Y[base + j] = x1 * c - x2 * sn;
        Y[base + j + R_HALF] = x2 * c + x1 * sn;
    }}
}}
"""
    conv = (lambda s: s) if language == "opencl" else to_cuda
    blocks = [16, 64, 256] if language == "opencl" else [64, 128, 256, 512]
    out = [
        Recipe(
            "rotary/naive",
            "rotary",
            language,
            conv(naive),
            _rot_forward(spec, "(_cdiv(pairs, p['BLOCK_X']), 1, 1)", "(p['BLOCK_X'], 1, 1)"),
            ["x", "cos", "sin"],
            TunableSpace(params={"BLOCK_X": blocks}),
            {"BLOCK_X": blocks[1]},
            rank=0,
            description="one rotated pair per work-item",
        ),
        Recipe(
            "rotary/heads_loop",
            "rotary",
            language,
            conv(heads),
            _rot_forward(spec, "(_cdiv(outer * S * half, p['BLOCK_X']), 1, 1)", "(p['BLOCK_X'], 1, 1)"),
            ["x", "cos", "sin"],
            TunableSpace(params={"BLOCK_X": blocks}),
            {"BLOCK_X": blocks[1]},
            rank=1,
            description="cos/sin loaded once per (position, column), reused across heads, FMA",
        ),
    ]
    vws = [2, 4, 8]  # a row's last half % VW columns: scalar
    if language == "opencl" and vws:
        vec = f"""{OPENCL_VECTOR_HELPERS}{pre}
__kernel void rotary({sig}) {{
    int g = get_global_id(0);
    int groups = (R_HALF + VW - 1) / VW;
    if (g >= R_OUTER * R_S * R_INNER * groups) return;
    int jv = g % groups, rest = g / groups;
    int s = (rest / R_INNER) % R_S;
    __global const float* xr = X + (long)rest * (2 * R_HALF);
    __global float* yr = Y + (long)rest * (2 * R_HALF);
    if (jv * VW + VW > R_HALF) {{
        for (int j = jv * VW; j < R_HALF; ++j) {{
            float x1 = xr[j], x2 = xr[j + R_HALF], c = COS[s * R_HALF + j], sn = SIN[s * R_HALF + j];
            yr[j] = x1 * c - x2 * sn;
            yr[j + R_HALF] = x2 * c + x1 * sn;
        }}
        return;
    }}
    floatv x1 = VLOADV(jv, xr), x2 = VLOADV(jv, xr + R_HALF);
    floatv c = VLOADV(jv, COS + s * R_HALF), sn = VLOADV(jv, SIN + s * R_HALF);
    VSTOREV(x1 * c - x2 * sn, jv, yr);
    VSTOREV(x2 * c + x1 * sn, jv, yr + R_HALF);
}}
"""
        out.append(
            Recipe(
                "rotary/vector",
                "rotary",
                language,
                vec,
                _rot_forward(
                    spec,
                    "(_cdiv(outer * S * inner * _cdiv(half, p['VW']), p['BLOCK_X']), 1, 1)",
                    "(p['BLOCK_X'], 1, 1)",
                ),
                ["x", "cos", "sin"],
                TunableSpace(params={"VW": vws, "BLOCK_X": [1, 4, 16, 64]}),
                {"VW": vws[-1], "BLOCK_X": 16},
                rank=2,
                description="vector loads of both halves and of cos/sin",
            )
        )
    if (
        language == "cuda"
    ):  # float4 where half % 4 == 0 and every tensor is 16-byte aligned, else rotary_scalar
        scalar = conv(naive).replace("void rotary(", "void rotary_scalar(")
        vec = f"""{scalar}
extern "C" __global__ void rotary(const float* __restrict__ X, const float* __restrict__ COS,
                                  const float* __restrict__ SIN, float* __restrict__ Y, int R_OUTER, int R_S,
                                  int R_INNER, int R_HALF) {{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= R_OUTER * R_S * R_INNER * (R_HALF / 4)) return;
    int jv = g % (R_HALF / 4), rest = g / (R_HALF / 4);
    int s = (rest / R_INNER) % R_S;
    const float4* xr = reinterpret_cast<const float4*>(X + (size_t)rest * (2 * R_HALF));
    float4* yr = reinterpret_cast<float4*>(Y + (size_t)rest * (2 * R_HALF));
    float4 a = __ldg(xr + jv), b = __ldg(xr + R_HALF / 4 + jv);
    float4 c = __ldg(reinterpret_cast<const float4*>(COS + s * R_HALF) + jv);
    float4 n = __ldg(reinterpret_cast<const float4*>(SIN + s * R_HALF) + jv);
    yr[jv] = make_float4(fmaf(a.x, c.x, -b.x * n.x), fmaf(a.y, c.y, -b.y * n.y),
                         fmaf(a.z, c.z, -b.z * n.z), fmaf(a.w, c.w, -b.w * n.w));
    yr[R_HALF / 4 + jv] = make_float4(fmaf(b.x, c.x, a.x * n.x), fmaf(b.y, c.y, a.y * n.y),
                                      fmaf(b.z, c.z, a.z * n.z), fmaf(b.w, c.w, a.w * n.w));
}}
"""
        out.append(
            Recipe(
                "rotary/vector",
                "rotary",
                language,
                vec,
                _rot_forward(
                    spec,
                    "(_cdiv(pairs // 4, p['BLOCK_X']), 1, 1)",
                    "(p['BLOCK_X'], 1, 1)",
                    fallback=("rotary_scalar", "(_cdiv(pairs, p['BLOCK_X']), 1, 1)"),
                ),
                ["x", "cos", "sin"],
                TunableSpace(params={"BLOCK_X": blocks}),
                {"BLOCK_X": 256},
                rank=2,
                description="float4 loads of both halves and of cos/sin",
            )
        )
    return out


def recipes(spec: OpSpec, language: str) -> list[Recipe]:
    return adapt(
        conv_recipes(spec, language) if spec.family == "depthwise_conv2d" else rotary_recipes(spec, language),
        spec,
    )
