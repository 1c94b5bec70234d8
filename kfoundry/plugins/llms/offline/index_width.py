"""Index width of the offline generator's kernels: 32-bit where every index provably fits, else 64-bit.

The cookbook writes its kernels with 32-bit ``int`` indices (fast: 32-bit division and modulo are
several times cheaper than 64-bit ones on GPUs). Kernels are generated per problem and shape, so the
choice is made here, once, from the largest tensor the problem touches (:func:`max_elements`):

* every index a cookbook kernel forms is an element offset into one of the problem's tensors, one
  vector or tile past it (``c * VW + VW``, a padded window), or such an offset plus a launch's worth of
  work-items (a grid-stride loop's last ``i += stride``); a product of dims that bounds a loop is the
  element count of a tensor or of a slice of one. :func:`fits_int32` asks for twice the largest tensor
  plus 2^24 (more work-items than any recipe's grid-stride launch) to stay below 2^31 - 1;
* where it does not, :func:`widen` rewrites the kernel source to 64-bit index arithmetic: every ``int``
  local, loop counter, helper parameter and ``(int)`` cast becomes ``long`` (OpenCL C, SYCL) or
  ``long long`` (CUDA), CUDA's ``blockIdx``/``gridDim`` are read as 64-bit (their products would wrap
  at 2^32 in unsigned 32-bit arithmetic), a CUDA kernel's ``int`` parameters become ``long long`` (a
  Python int fills 8 bytes there) and an OpenCL kernel's ``int`` parameters keep their 4-byte ABI
  (the OpenCL launcher passes Python ints as int32) but are copied into ``long`` locals of the same
  name first thing, so no product of them is formed in 32 bits. Left alone: ``unsigned int`` (bit
  patterns), ``int`` pointers (their pointee types are an ABI) and ``__local``/``__shared__`` ``int``
  arrays (atomics and their sizes; they hold small counts). Triton sources get 64-bit program ids.

A lowered graph (:mod:`.lower`, ``graph/*`` recipes) already forms its flat indices in 64 bits; its
32-bit locals stay within one sample of a tensor (:func:`max_per_sample`), so it is widened only where
that does not fit. ``KF_INDEX_WIDTH=32|64`` in the environment forces either (for measurements).

Every recipe list of the cookbooks passes through :func:`adapt` (tests/test_offline_index_width.py
checks the real KernelBench sizes, runs widened kernels on PoCL and compiles them with NVRTC).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from typing import Any

INT32_MAX = (1 << 31) - 1
#: More work-items than any recipe launches in a grid-stride loop (WAVES x 132 SMs x 1024 threads < 2^24).
LAUNCH_SLACK = 1 << 24


def _shapes(spec: Any) -> list[list[int]]:
    """Every tensor shape ``spec``'s problem touches: inputs, output and, for a lowered graph, every
    intermediate the traced graph holds (its ``tensor_meta`` shapes)."""
    shapes = [list(s) for s in spec.input_shapes] + [list(spec.output_shape)]
    graph = getattr(spec, "graph", None)
    for node in getattr(getattr(graph, "graph", None), "nodes", ()):
        metas = node.meta.get("tensor_meta")
        for meta in metas if isinstance(metas, (list, tuple)) else [metas]:
            if hasattr(meta, "shape"):
                shapes.append([int(d) for d in meta.shape])
    if spec.family == "matmul" or spec.M:  # the operands and the product of a matrix multiply
        shapes += [[spec.M, spec.K], [spec.K, spec.N], [spec.M, spec.N]]
    dims = getattr(spec, "dims", None) or {}
    if dims:
        shapes.append([max(1, int(v)) for k, v in dims.items() if k in ("N", "C", "H", "W")])
    return shapes


def max_elements(spec: Any) -> int:
    """The element count of the largest tensor ``spec``'s problem touches."""
    return max((math.prod(s) for s in _shapes(spec)), default=0)


def max_per_sample(spec: Any) -> int:
    """The largest count a lowered graph's kernels hold in 32 bits: one sample of a tensor (its elements
    over its leading dimension) or a leading dimension. The graph lowering (:mod:`.lower`) forms every
    flat element index, coordinate and stride product in 64 bits (``kf_long``); its ``int`` locals are
    thread and lane ids, tile and window loop counters, and an implicit-GEMM convolution's coordinates
    within one image (output pixel, channel, filter tap, ``channel * image size``)."""
    out = 0
    for s in _shapes(spec):
        n = math.prod(s)
        out = max(out, n // s[0] if len(s) > 1 and s[0] else n, s[0] if s else 1)
    return out


def fits_int32(elements: int) -> bool:
    """Whether a kernel over tensors of at most ``elements`` elements may index in 32 bits, with margin."""
    return 2 * elements + LAUNCH_SLACK <= INT32_MAX


def wide_needed(spec: Any) -> bool:
    """Whether ``spec``'s kernels need 64-bit indices. ``KF_INDEX_WIDTH=32`` / ``=64`` forces either
    (measuring the cost of the wide variants; running them at small sizes), anything else: from the
    shapes (the cookbook's kernels index whole tensors in ``int``; a lowered graph, one sample)."""
    forced = os.environ.get("KF_INDEX_WIDTH", "")
    if forced in ("32", "64"):
        return forced == "64"
    if spec.family == "graph":
        return not fits_int32(max_per_sample(spec))
    return not fits_int32(max_elements(spec))


# -- the rewrite ---------------------------------------------------------------------------------------

#: an attribute between a kernel's head and its name: ``__launch_bounds__(...)`` or ``__cluster_dims__(...)``
#: (one level of nested parentheses) or a macro spelled ``KF_*_BOUNDS``
_ATTR = r"(?:\s+(?:__\w+__\s*\((?:[^()]|\([^()]*\))*\)|KF_\w*BOUNDS))*"
_KERNEL_HEAD = re.compile(rf"(__kernel\s+void|__global__\s+void{_ATTR}|KF_KERNEL{_ATTR})\s+(\w+)\s*\(")
#: an ``int`` that names a scalar (not ``unsigned int``, not an ``int*``, not a local-memory array)
_INT = re.compile(r"\bint\b(?!\s*\*)")
_KEEP_BEFORE = re.compile(r"(unsigned|__local|__shared__|KF_LOCAL|volatile|atomic_|struct)\s*(const\s+)?$")
_PARAM_INT = re.compile(r"^\s*(const\s+)?int\s+(\w+)\s*$")


def _close(text: str, start: int) -> int:
    """Index of the ``)`` matching the ``(`` at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced parentheses in a kernel signature")


def _split_params(params: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in params:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def _widen_ints(text: str, wide: str) -> str:
    def sub(m: re.Match[str]) -> str:
        line_start = text.rfind("\n", 0, m.start()) + 1
        if _KEEP_BEFORE.search(text[line_start : m.start()]):
            return m.group(0)
        return wide

    return _INT.sub(sub, text)


def widen(source: str, language: str) -> str:
    """``source`` (OpenCL C, CUDA or Triton) with 64-bit index arithmetic (see the module doc)."""
    if language == "triton":
        return re.sub(r"\btl\.(program_id|num_programs)\(([^()]*)\)", r"tl.\1(\2).to(tl.int64)", source)
    cuda = language == "cuda"
    wide = "long long" if cuda else "long"
    pieces: list[str] = []
    pos = 0
    shadows: list[tuple[int, str]] = []  # (index in pieces of a body's opening, the copies to insert)
    for m in _KERNEL_HEAD.finditer(source):
        if m.start() < pos:
            continue
        open_ = m.end() - 1
        close = _close(source, open_)
        params: list[str] = []
        copies: list[str] = []
        for param in _split_params(source[open_ + 1 : close]):
            pm = _PARAM_INT.match(param)
            if pm is None:
                params.append(param)
            elif cuda:
                params.append(param.replace("int", "long long", 1))
            else:
                name = pm.group(2)
                params.append(f"{param[: pm.start(2)]}{name}_kf32{param[pm.end(2) :]}")
                copies.append(f" long {name} = {name}_kf32;")
        body = source.index("{", close)
        pieces += [_widen_ints(source[pos:open_], wide), "(" + ",".join(params) + ")"]
        pieces.append(_widen_ints(source[close + 1 : body + 1], wide))
        if copies:
            shadows.append((len(pieces) - 1, "".join(copies)))
        pos = body + 1
    pieces.append(_widen_ints(source[pos:], wide))
    for index, copied in shadows:
        pieces[index] += copied
    out = "".join(pieces)
    if cuda:
        out = re.sub(r"(?<![\w.])(blockIdx|gridDim)\.([xyz])\b", r"((long long)\1.\2)", out)
        out = CUDA_MIXED_MINMAX + out
    return out


#: ``min``/``max`` of a 64-bit index and a 32-bit one (a macro, a literal, ``threadIdx``): CUDA declares
#: only same-type integer overloads, so a widened kernel's ``min(i, BLOCK)`` would be ambiguous.
CUDA_MIXED_MINMAX = "".join(
    f"static __device__ __forceinline__ long long {f}({a} a, {b} b) {{ return (long long)a {op} (long long)b "
    "? (long long)a : (long long)b; }\n"
    for f, op in (("min", "<"), ("max", ">"))
    for a, b in (
        ("long long", "int"),
        ("int", "long long"),
        ("long long", "unsigned int"),
        ("unsigned int", "long long"),
    )
)


def adapt(recipes: list[Any], spec: Any, force: bool | None = None) -> list[Any]:
    """``recipes`` with 64-bit index arithmetic where ``spec``'s sizes need it (``force``: regardless).
    A widened recipe says so in its description; its name stays (the ladder and the archive key on it)."""
    if not (wide_needed(spec) if force is None else force):
        return recipes
    out = []
    for r in recipes:
        if "index64" in r.description:
            out.append(r)
            continue
        out.append(
            replace(
                r,
                kernel=widen(r.kernel, r.language),
                description=f"{r.description} [index64: 64-bit index arithmetic]".strip(),
            )
        )
    return out
