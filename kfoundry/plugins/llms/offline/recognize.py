"""Recognise the operation family of a KernelBench reference by tracing it with ``torch.fx``.

Families: ``elementwise`` (a chain of elementwise ops over same-shape inputs), ``matmul`` (matrix
multiply or ``nn.Linear``, with an elementwise epilogue), ``softmax``, ``log_softmax``,
``layer_norm``, ``rms_norm`` and ``reduce`` (sum / mean / max / min over one dimension). Every
recognition is confirmed numerically against the reference on small random inputs before use.
"""

from __future__ import annotations

import math
import operator
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.passes.shape_prop import ShapeProp

from kfoundry.core.generator import GeneratorUnsupported, ProblemSummary
from kfoundry.plugins.llms.offline.elementwise_ops import node_expr
from kfoundry.plugins.llms.offline.normalize import normalize, with_shapes

FAMILIES = (
    "elementwise",
    "matmul",
    "gemm",
    "softmax",
    "log_softmax",
    "layer_norm",
    "rms_norm",
    "reduce",
    "depthwise_conv2d",
    "rotary",
)


@dataclass
class OpSpec:
    """What the cookbook needs to write kernels for one problem."""

    family: str
    #: Shapes of the forward inputs.
    input_shapes: list[list[int]]
    output_shape: list[int]
    #: ``lang -> C expression``: elementwise body over ``v0, v1, ...`` or the epilogue over ``v``.
    expr: Callable[[str], str] | None = None
    #: The same with every intermediate value bound once (``let_block``): a chain that uses a value
    #: several times (``nan_to_num``, clamps, ``where``) stays linear in size instead of growing
    #: exponentially; scalar C only (not Triton, not OpenCL vector arithmetic).
    expr_lets: Callable[[str], str] | None = None
    # matmul
    M: int = 0
    N: int = 0
    K: int = 0
    linear: bool = False
    bias: bool = False
    #: The inputs' dtype (``float16``/``bfloat16``: tensor-core matmul recipes).
    dtype: str = "float32"
    # row families: data viewed as [outer, R, inner], reduced over R
    outer: int = 0
    R: int = 0
    inner: int = 1
    #: The dimension reduced (row families; layer norm: the first normalised dimension), >= 0.
    dim: int = 0
    eps: float = 0.0
    reduce_op: str = ""
    affine: bool = False
    #: Constructor lines for ModelNew parameter modules, in the reference's order.
    modules: list[str] = field(default_factory=list)
    #: Attribute path of the parameter module used by the kernel (``self.<name>``).
    param_module: str = ""
    #: Family-specific sizes (depthwise conv: N, C, H, W, KS, stride, pad, OH, OW; rotary: axes).
    dims: dict[str, int] = field(default_factory=dict)
    #: ``gemm``: the product variant (:mod:`.recognize_mm`: ta, tb, batch, flat, tri, dg, diag).
    mm: dict[str, int] = field(default_factory=dict)
    #: ``graph``: the traced reference (on the meta device) and its source, for :mod:`.lower`.
    graph: Any = None
    source: str = ""

    @property
    def numel(self) -> int:
        return math.prod(self.output_shape)


def load_reference(problem: ProblemSummary) -> types.ModuleType:
    """Execute the reference source in a fresh module with the shape constants in force."""
    from kfoundry.plugins.llms.offline.lower import with_shapes

    module = types.ModuleType(f"kf_reference_{problem.name}")
    try:  # the overrides rewrite their lines, so constants derived from them follow
        tree = with_shapes(problem.reference_source, dict(problem.shapes))
        exec(compile(tree, problem.path or problem.name, "exec"), module.__dict__)
    except Exception as exc:  # the reference is checked by the evaluator; here it only blocks recognition
        raise GeneratorUnsupported(f"offline generator: cannot execute the reference: {exc}") from None
    for key, value in problem.shapes.items():
        setattr(module, key, value)
    return module


def _module_ctor(mod: nn.Module, args: dict[str, str] | None = None) -> str:
    """Python constructor text for a parameter module (recreates its RNG draws in order).

    ``args`` maps a constructor argument to the Python text that computes it in ``ModelNew.__init__``
    (``init_inputs[i]``), so a module sized by the init inputs follows them at any shape.
    """
    a = args or {}
    if isinstance(mod, nn.Linear):
        return (
            f"nn.Linear({a.get('in_features', mod.in_features)}, {a.get('out_features', mod.out_features)}, "
            f"bias={mod.bias is not None})"
        )
    if isinstance(mod, nn.Conv2d):
        return (
            f"nn.Conv2d({a.get('in_channels', mod.in_channels)}, {a.get('out_channels', mod.out_channels)}, "
            f"{a.get('kernel_size', mod.kernel_size[0])}, stride={a.get('stride', mod.stride[0])}, "
            f"padding={a.get('padding', mod.padding[0])}, groups={a.get('groups', mod.groups)}, "
            f"bias={mod.bias is not None})"
        )
    if isinstance(mod, nn.LayerNorm):
        return (
            f"nn.LayerNorm({a.get('normalized_shape', repr(tuple(mod.normalized_shape)))}, eps={mod.eps!r}, "
            f"elementwise_affine={mod.elementwise_affine})"
        )
    raise GeneratorUnsupported(
        f"offline generator: parameter module {type(mod).__name__} is not in the cookbook"
    )


def _ctor_values(mod: nn.Module) -> dict[str, Any]:
    if isinstance(mod, nn.Linear):
        return {"in_features": mod.in_features, "out_features": mod.out_features}
    if isinstance(mod, nn.Conv2d):
        return {
            "in_channels": mod.in_channels,
            "out_channels": mod.out_channels,
            "kernel_size": mod.kernel_size[0],
            "stride": mod.stride[0],
            "padding": mod.padding[0],
            "groups": mod.groups,
        }
    if isinstance(mod, nn.LayerNorm):
        return {"normalized_shape": tuple(mod.normalized_shape)}
    return {}


#: Largest total input size (elements) for which recognition runs the reference numerically.
CONFIRM_LIMIT = 1 << 22


class _Trace:
    """The reference traced on the meta device (no full-size allocation in the calling process)."""

    def __init__(self, problem: ProblemSummary) -> None:
        ref = load_reference(problem)
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(ref, name):
                raise GeneratorUnsupported(f"offline generator: the reference has no {name}")
        self.ref = ref
        self.source = problem.reference_source
        self.shapes = dict(problem.shapes)
        torch.manual_seed(0)
        self.init_inputs = list(ref.get_init_inputs())
        validate = torch.distributions.Distribution._validate_args
        try:
            # inputs drawn from a distribution (``Pareto(0.01, 1.5).sample(...)``): its argument checks
            # read values, which meta tensors do not have
            torch.distributions.Distribution.set_default_validate_args(False)
            with torch.device("meta"):
                self.model: nn.Module = ref.Model(*self.init_inputs)
                self.inputs = [x for x in ref.get_inputs()]
        except Exception as exc:
            raise GeneratorUnsupported(
                f"offline generator: cannot build the reference on the meta device: {exc}"
            ) from None
        finally:
            torch.distributions.Distribution.set_default_validate_args(validate)
        try:
            self.gm = normalize(fx.symbolic_trace(self.model))
            ShapeProp(self.gm).propagate(*self.inputs)
            for _ in range(3):  # a rewritten node's users get their shapes in the next round
                if not with_shapes(self.gm):
                    break
                ShapeProp(self.gm).propagate(*self.inputs)
        except Exception as exc:
            raise GeneratorUnsupported(f"offline generator: cannot trace the reference: {exc}") from None
        self.nodes = [n for n in self.gm.graph.nodes if n.op not in ("placeholder", "output")]
        self.placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        outs = [n for n in self.gm.graph.nodes if n.op == "output"][0].args[0]
        if not isinstance(outs, fx.Node):
            raise GeneratorUnsupported("offline generator: the reference must return one tensor")
        self.out = outs
        dtypes = {x.dtype for x in self.inputs if isinstance(x, torch.Tensor)}
        #: fp16/bf16 problems (every tensor input of that one dtype): the matmul family only.
        self.half = dtypes in ({torch.float16}, {torch.bfloat16})
        kinds = (
            (torch.float32, torch.int64, torch.bool, *dtypes)
            if self.half
            else (torch.float32, torch.int64, torch.bool)
        )
        if any(
            isinstance(x, bool)
            or not isinstance(x, torch.Tensor | int | float)
            or (isinstance(x, torch.Tensor) and x.dtype not in kinds)
            for x in self.inputs
        ):
            raise GeneratorUnsupported(
                "offline generator: the cookbook handles float32 (int64 index, bool mask) tensors and numbers only"
            )
        self.float_only = all(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in self.inputs)
        self.modules = [
            m for m in self.model.modules() if m is not self.model and list(m.parameters(recurse=False))
        ]
        self._real: tuple[nn.Module, list[torch.Tensor]] | None = None

    def real(self) -> tuple[nn.Module, list[torch.Tensor]] | None:
        """The reference and inputs in memory, when they are small (None otherwise)."""
        if sum(x.numel() for x in self.inputs) > CONFIRM_LIMIT:
            return None
        if self._real is None:
            torch.manual_seed(0)
            model = self.ref.Model(*self.init_inputs)
            self._real = (model, list(self.ref.get_inputs()))
        return self._real

    def ctors(self) -> list[str]:
        """Constructor lines of the parameter modules, their sizes read from ``init_inputs`` where they come
        from there: found by building the reference again with one integer init input changed at a time."""
        named = [(n, m) for n, m in self.model.named_modules() if m in self.modules]
        args: dict[str, dict[str, str]] = {n: {} for n, _ in named}
        for n, m in named:
            for arg, value in _ctor_values(m).items():
                for i, v in enumerate(self.init_inputs):
                    if isinstance(v, tuple | list) and tuple(v) == value:
                        args[n].setdefault(arg, f"tuple(init_inputs[{i}])")
        for i, v in enumerate(self.init_inputs):
            if not isinstance(v, int) or isinstance(v, bool):
                continue
            changed = [*self.init_inputs[:i], v + 1, *self.init_inputs[i + 1 :]]
            try:
                with torch.device("meta"):
                    other = dict(self.ref.Model(*changed).named_modules())
            except Exception:
                continue
            for n, m in named:
                if n not in other or type(other[n]) is not type(m):
                    continue
                before, after = _ctor_values(m), _ctor_values(other[n])
                for arg, value in before.items():
                    if isinstance(value, int) and after.get(arg) == value + 1:
                        args[n].setdefault(arg, f"init_inputs[{i}]")
                    elif isinstance(value, tuple) and len(value) == 1 and after.get(arg) == (value[0] + 1,):
                        args[n].setdefault(arg, f"(init_inputs[{i}],)")
        return [_module_ctor(m, args[n]) for n, m in named]

    def shape(self, node: Any) -> list[int]:
        meta = node.meta.get("tensor_meta")
        return list(meta.shape) if meta is not None else []


def recognize(problem: ProblemSummary) -> OpSpec:
    """The :class:`OpSpec` of ``problem``, or :class:`GeneratorUnsupported` saying why not."""
    t = _Trace(problem)
    anchors = [n for n in t.nodes if node_expr(n, t.gm, lambda a: "x", "opencl") is None]
    anchors = [n for n in anchors if not (n.op == "call_function" and n.target is operator.getitem)]
    refusal: GeneratorUnsupported | None = None
    families = (_elementwise, _matmul, _rows, _rms_norm, _depthwise, _rotary)
    for recognizer in families if t.float_only else (_matmul,) if t.half else ():
        try:
            spec = recognizer(t, anchors)
            if spec is not None:
                _confirm(t, spec)
                return spec
        except GeneratorUnsupported as exc:
            refusal = refusal or exc
    if t.half:
        raise refusal or GeneratorUnsupported("offline generator: fp16/bf16 problems: a matrix product only")
    try:
        return _graph(t)
    except GeneratorUnsupported as exc:
        ops = ", ".join(sorted({str(getattr(n.target, "__name__", n.target)) for n in anchors})) or "none"
        raise GeneratorUnsupported(
            f"offline generator: problem {problem.name!r} is not a known operation family "
            f"(anchor ops: {ops}; {str(exc).removeprefix('offline generator: ')}); use an LLM generator for it"
        ) from None


def _graph(t: _Trace) -> OpSpec:
    """The whole graph, lowered op by op (:mod:`.lower`): refused here if any op has no recipe."""
    from kfoundry.plugins.llms.offline.lower import Lowering

    Lowering(t.gm, "opencl", True).run(len(t.inputs))
    shapes = [list(x.shape) if isinstance(x, torch.Tensor) else [] for x in t.inputs]
    return OpSpec(
        family="graph",
        input_shapes=shapes,
        output_shape=t.shape(t.out),
        graph=t.gm,
        source=t.source,
        dims={k: v for k, v in t.shapes.items() if isinstance(v, int)},
    )


def let_block(lang: str, lets: list[str], result: str) -> str:
    """One C expression that binds ``lets`` (``const float t = ...;`` statements) then yields ``result``:
    a GNU statement expression in OpenCL C (clang), an immediately called lambda in CUDA (NVRTC takes
    no statement expressions); both inline to straight-line code."""
    if not lets:
        return result
    body = " ".join(lets)
    if lang == "cuda":
        return f"([&]() -> float {{ {body} return {result}; }}())"
    return f"({{ {body} ({result}); }})"


def _expr_over(
    t: _Trace, names: dict[fx.Node, str], start: set[fx.Node], lang: str, lets: bool = False
) -> str:
    """C expression of ``t.out`` over the nodes in ``names`` (placeholders or the anchor); ``lets``: each
    intermediate node's value bound once to a temporary (see :func:`let_block`)."""
    exprs: dict[fx.Node, str] = dict(names)
    bound: list[str] = []

    def operand(a: Any) -> str:
        if isinstance(a, fx.Node):
            if a not in exprs:
                raise GeneratorUnsupported(
                    "offline generator: an elementwise operand comes from an unsupported op"
                )
            return exprs[a]
        if isinstance(a, bool) or not isinstance(a, int | float):
            raise GeneratorUnsupported(f"offline generator: operand {a!r} is not a number")
        from kfoundry.plugins.llms.offline.elementwise_ops import lit

        return lit(float(a))

    for node in t.nodes:
        if node in exprs or node in start:
            continue
        e = node_expr(node, t.gm, operand, lang)
        if e is None:
            raise GeneratorUnsupported(
                f"offline generator: op {node.target} after the main op is not elementwise"
            )
        if lets and node is not t.out:
            bound.append(e)
            e = f"kf_t{len(bound) - 1}"
        exprs[node] = e
    return _inline_single_uses(lang, bound, exprs[t.out])


_TEMP = re.compile(r"\bkf_t(\d+)\b")


def _inline_single_uses(lang: str, values: list[str], result: str) -> str:
    """``values[k]`` bound to ``kf_t<k>``: those used more than once stay bound (``let_block``), the rest
    are written in place (a chain without reuse comes out exactly as the plain expression)."""
    uses = [0] * len(values)
    for text in [*values, result]:
        for m in _TEMP.finditer(text):
            uses[int(m.group(1))] += 1
    text_of: dict[int, str] = {}

    def expand(text: str) -> str:
        return _TEMP.sub(lambda m: text_of.get(int(m.group(1)), m.group(0)), text)

    lets = []
    for k, value in enumerate(values):
        value = expand(value)
        if uses[k] > 1:
            lets.append(f"const float kf_t{k} = {value};")
        else:
            text_of[k] = value
    return let_block(lang, lets, expand(result))


def _elementwise(t: _Trace, anchors: list[fx.Node]) -> OpSpec | None:
    if anchors:
        return None
    shapes = [list(x.shape) for x in t.inputs]
    out = t.shape(t.out)
    if any(s != out for s in shapes):
        raise GeneratorUnsupported("offline generator: elementwise inputs must all have the output's shape")
    names = {p: f"v{i}" for i, p in enumerate(t.placeholders)}
    return OpSpec(
        family="elementwise",
        input_shapes=shapes,
        output_shape=out,
        expr=lambda lang: _expr_over(t, names, set(), lang),
        expr_lets=lambda lang: _expr_over(t, names, set(), lang, lets=True),
    )


def _matmul(t: _Trace, anchors: list[fx.Node]) -> OpSpec | None:
    from kfoundry.plugins.llms.offline.recognize_mm import matmul_variant

    variant = matmul_variant(t, anchors)  # batched / transposed / triangular / diag: family "gemm"
    if variant is not None:
        return variant
    if len(anchors) != 1:
        return None
    node = anchors[0]
    mod = t.gm.get_submodule(str(node.target)) if node.op == "call_module" else None
    is_linear = isinstance(mod, nn.Linear) or (node.op == "call_function" and node.target is F.linear)
    is_mm = node.target in (torch.matmul, torch.mm, operator.matmul) or (
        node.op == "call_method" and node.target in ("matmul", "mm")
    )
    if not (is_linear or is_mm):
        return None
    if is_linear and t.half:
        raise GeneratorUnsupported("offline generator: fp16/bf16 linear layers are not in the cookbook")
    if is_linear and mod is None:
        raise GeneratorUnsupported("offline generator: F.linear with explicit weights is not in the cookbook")
    a_node = node.args[0]
    if not (isinstance(a_node, fx.Node) and a_node.op == "placeholder"):
        raise GeneratorUnsupported("offline generator: the matmul's inputs must be forward arguments")
    a = t.shape(a_node)
    if is_linear:
        assert isinstance(mod, nn.Linear)
        if len(a) != 2 or len(t.inputs) != 1:
            raise GeneratorUnsupported("offline generator: linear layers on 2-D inputs only")
        M, K, N = a[0], a[1], mod.out_features
        b_shape = [N, K]
    else:
        b_node = node.args[1]
        if not (isinstance(b_node, fx.Node) and b_node.op == "placeholder") or len(t.placeholders) != 2:
            raise GeneratorUnsupported("offline generator: the matmul's inputs must be forward arguments")
        b_shape = t.shape(b_node)
        flat = len(a) == 3 and node.target in (torch.matmul, operator.matmul)  # [.., M, K] @ [K, N]: one GEMM
        if len(a) != 2 + flat or len(b_shape) != 2 or (a_node, b_node) != tuple(t.placeholders):
            raise GeneratorUnsupported("offline generator: matmul of two 2-D inputs (A, B) only")
        M, K, N = math.prod(a[:-1]), a[-1], b_shape[1]
    expr = (lambda lang: _expr_over(t, {node: "v"}, {node}, lang)) if t.out is not node else None
    return OpSpec(
        family="matmul",
        input_shapes=[list(x.shape) for x in t.inputs],
        output_shape=[*a[:-1], N],
        expr=expr,
        M=M,
        N=N,
        K=K,
        linear=is_linear,
        bias=bool(is_linear and mod is not None and mod.bias is not None),
        dtype=str(t.inputs[0].dtype).removeprefix("torch."),
        modules=t.ctors(),
        param_module=str(node.target) if is_linear else "",
    )


_REDUCE = {
    torch.sum: "sum",
    torch.mean: "mean",
    torch.amax: "max",
    torch.amin: "min",
    torch.max: "max",
    torch.min: "min",
    torch.prod: "prod",
}
_REDUCE_METHODS = {
    "sum": "sum",
    "mean": "mean",
    "amax": "max",
    "amin": "min",
    "max": "max",
    "min": "min",
    "prod": "prod",
}


def _dim_arg(node: fx.Node, pos: int = 1) -> Any:
    return node.kwargs.get("dim", node.args[pos] if len(node.args) > pos else None)


def _split(shape: list[int], dim: int) -> tuple[int, int, int]:
    dim = dim % len(shape)
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1 :])


def _rows(t: _Trace, anchors: list[fx.Node]) -> OpSpec | None:
    if len(anchors) != 1 or len(t.placeholders) != 1:
        return None
    node = anchors[0]
    x = t.inputs[0]
    shape = list(x.shape)
    out = t.shape(t.out)
    tail_ok = t.out is node or (
        t.out.op == "call_function"
        and t.out.target is operator.getitem
        and t.out.args[0] is node
        and t.out.args[1] == 0
    )
    if not tail_ok or node.args[0] is not t.placeholders[0]:
        return None
    target: Any = node.target  # a function, a method name or a module path, by node.op
    ln = t.gm.get_submodule(target) if node.op == "call_module" else None
    if isinstance(ln, nn.LayerNorm):
        r = math.prod(ln.normalized_shape)
        return OpSpec(
            family="layer_norm",
            input_shapes=[shape],
            output_shape=out,
            outer=x.numel() // r,
            R=r,
            inner=1,
            dim=len(shape) - len(ln.normalized_shape),
            eps=float(ln.eps),
            affine=ln.elementwise_affine,
            modules=t.ctors(),
            param_module=str(target),
        )
    fam = None
    if target in (torch.softmax, F.softmax) or (node.op == "call_method" and target == "softmax"):
        fam = "softmax"
    elif target in (torch.log_softmax, F.log_softmax) or (
        node.op == "call_method" and target == "log_softmax"
    ):
        fam = "log_softmax"
    if fam is not None:
        outer, r, inner = _split(shape, int(_dim_arg(node)))
        if inner != 1:
            raise GeneratorUnsupported(
                f"offline generator: {fam} over a non-last dimension is not in the cookbook"
            )
        return OpSpec(
            family=fam,
            input_shapes=[shape],
            output_shape=out,
            outer=outer,
            R=r,
            inner=1,
            dim=int(_dim_arg(node)) % len(shape),
        )
    op = _REDUCE.get(target) if node.op == "call_function" else None
    if node.op == "call_method":
        op = _REDUCE_METHODS.get(target)
    if op is None:
        return None
    dim = _dim_arg(node)
    if op == "prod" and not isinstance(dim, int):
        return None  # a product over all elements: the graph lowering's
    if isinstance(dim, list | tuple):
        if len(dim) != 1:
            raise GeneratorUnsupported("offline generator: reductions over one dimension only")
        dim = dim[0]
    if not isinstance(dim, int):
        raise GeneratorUnsupported("offline generator: full reductions are not in the cookbook")
    outer, r, inner = _split(shape, dim)
    return OpSpec(
        family="reduce",
        input_shapes=[shape],
        output_shape=out,
        outer=outer,
        R=r,
        inner=inner,
        reduce_op=op,
        dim=dim % len(shape),
    )


def _rms_norm(t: _Trace, anchors: list[fx.Node]) -> OpSpec | None:
    """x / sqrt(mean(x^2, dim) + eps) (or x * rsqrt(...)): recognised by its mean, confirmed numerically."""
    if len(t.placeholders) != 1:
        return None
    means = [
        n for n in anchors if n.target in (torch.mean,) or (n.op == "call_method" and n.target == "mean")
    ]
    if len(means) != 1 or len(anchors) != 1:
        return None
    dim = _dim_arg(means[0])
    if isinstance(dim, list | tuple):
        if len(dim) != 1:
            return None
        dim = dim[0]
    if not isinstance(dim, int):  # a mean over everything (``x.mean()``) is not a row norm
        return None
    eps = [a for n in t.nodes for a in n.args if isinstance(a, float) and 0 < a < 0.1]
    shape = list(t.inputs[0].shape)
    outer, r, inner = _split(shape, int(dim))
    return OpSpec(
        family="rms_norm",
        input_shapes=[shape],
        output_shape=t.shape(t.out),
        outer=outer,
        R=r,
        inner=inner,
        dim=int(dim) % len(shape),
        eps=eps[0] if eps else 0.0,
    )


def _depthwise(t: _Trace, anchors: list[fx.Node]) -> OpSpec | None:
    if len(anchors) != 1 or anchors[0].op != "call_module" or t.out is not anchors[0] or len(t.inputs) != 1:
        return None
    conv = t.gm.get_submodule(str(anchors[0].target))
    if not isinstance(conv, nn.Conv2d):
        return None
    square = conv.kernel_size[0] == conv.kernel_size[1] and conv.stride[0] == conv.stride[1]
    if not (
        conv.groups == conv.in_channels == conv.out_channels
        and square
        and conv.dilation == (1, 1)
        and isinstance(conv.padding, tuple)
        and conv.padding[0] == conv.padding[1]
        and conv.padding_mode == "zeros"
    ):
        raise GeneratorUnsupported(
            "offline generator: only depthwise square 2-D convolutions are in the cookbook"
        )
    n, c, h, w = t.inputs[0].shape
    out = t.shape(t.out)
    dims = {
        "N": n,
        "C": c,
        "H": h,
        "W": w,
        "KS": conv.kernel_size[0],
        "stride": conv.stride[0],
        "pad": conv.padding[0],
        "OH": out[2],
        "OW": out[3],
    }
    return OpSpec(
        family="depthwise_conv2d",
        input_shapes=[[n, c, h, w]],
        output_shape=out,
        dims=dims,
        bias=conv.bias is not None,
        modules=t.ctors(),
        param_module=str(anchors[0].target),
    )


def _rotary(t: _Trace, anchors: list[fx.Node]) -> OpSpec | None:
    """Rotate-half rotary embedding of x [..., S, ..., D] by cos/sin [S, D/2]: confirmed numerically."""
    if len(t.inputs) != 3 or not any(n.target is torch.cat for n in t.nodes):
        return None
    x, cos, sin = t.inputs
    if cos.dim() != 2 or cos.shape != sin.shape or x.shape[-1] != 2 * cos.shape[1]:
        return None
    for axis in [a for a in range(x.dim() - 1) if x.shape[a] == cos.shape[0]]:
        dims = {
            "S": x.shape[axis],
            "half": cos.shape[1],
            "inner": math.prod(x.shape[axis + 1 : -1]),
            "outer": math.prod(x.shape[:axis]),
            "axis": axis,
        }
        spec = OpSpec(
            family="rotary",
            input_shapes=[list(i.shape) for i in t.inputs],
            output_shape=list(x.shape),
            dims=dims,
        )
        real = t.real()
        if real is None:
            return spec
        expected = spec_reference(spec, real[0], real[1])
        with torch.no_grad():
            got = real[0](*real[1])
        if expected is not None and got.shape == expected.shape and torch.allclose(got, expected, atol=1e-5):
            return spec
    return None


def spec_reference(spec: OpSpec, model: nn.Module, inputs: list[torch.Tensor]) -> torch.Tensor | None:
    """What the cookbook will compute, in torch (None where the kernel itself is the check)."""
    x = inputs[0]
    if spec.family == "rotary":
        d = spec.dims
        v = x.reshape(d["outer"], d["S"], d["inner"], 2 * d["half"])
        x1, x2 = v[..., : d["half"]], v[..., d["half"] :]
        c = inputs[1][None, :, None, :]
        s = inputs[2][None, :, None, :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).reshape(x.shape)
    if spec.family == "rms_norm":
        v = x.reshape(spec.outer, spec.R, spec.inner)
        y = v / torch.sqrt((v * v).mean(dim=1, keepdim=True) + spec.eps)
        return y.reshape(x.shape)
    return None


def _confirm(t: _Trace, spec: OpSpec) -> None:
    real = t.real() if spec.family in ("rotary", "rms_norm") else None
    if real is None:
        return
    expected = spec_reference(spec, real[0], real[1])
    if expected is None:
        return
    with torch.no_grad():
        got = real[0](*real[1])
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
        raise GeneratorUnsupported(
            f"offline generator: the reference looks like {spec.family} but does not compute it"
        )
