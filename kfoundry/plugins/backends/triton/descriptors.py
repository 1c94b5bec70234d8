"""Static behaviour descriptors of Triton kernels: the three axes in Triton's block vocabulary.

- ``memory``: 1 masked block loads over ``tl.arange`` (coalesced by construction), hints such as
  ``tl.multiple_of`` or cache modifiers; 2 on-chip reuse: a block kept in registers (``*cache* =
  tl.load(...)``), 2-D tiles (block pointers, tensor descriptors, broadcast ``[:, None]`` index grids); 3 software pipelining (``num_stages``) or a grouped (L2-swizzled) order;
- ``compute``: 1 fused arithmetic (``tl.fma``, a fused epilogue); 2 single-pass / online statistics;
  3 tiled matrix products (``tl.dot`` over a ``BLOCK_K`` loop);
- ``parallelism``: 1 block-wide reductions (``tl.sum``, ``tl.max``...); 2 explicit warp counts and
  intra-block data movement (scans, ``tl.trans``, ``tl.reshape``); 3 grid-level cooperation (atomics,
  persistent programs over ``tl.num_programs``, a multi-axis grid).
"""

from __future__ import annotations

import io
import re
import tokenize

from kfoundry.core.descriptors import Measurer, Pattern, PatternDescriptors

TRITON_PATTERNS: dict[str, list[Pattern]] = {
    "memory": [
        Pattern(1, r"\btl\.load\s*\([^\n]*\bmask\s*=", 1.0),
        Pattern(1, r"\btl\.(multiple_of|max_contiguous)\s*\(|\b(eviction_policy|cache_modifier)\s*=", 0.5),
        Pattern(2, r"\btl\.(make_block_ptr|advance|make_tensor_descriptor)\s*\(|\bTensorDescriptor\b", 1.0),
        Pattern(2, r"\[\s*:\s*,\s*None\s*\]|\[\s*None\s*,\s*:\s*\]", 0.6),
        Pattern(2, r"\b\w*cache\w*\s*=\s*tl\.load\s*\(", 1.0),
        Pattern(3, r"\bnum_stages\s*=\s*([2-9]|\w+)", 0.6),
        Pattern(3, r"\btl\.range\s*\([^)]*num_stages", 1.0),
        Pattern(3, r"\bGROUP_(SIZE_)?M\b", 0.6),
    ],
    "compute": [
        Pattern(1, r"\btl\.fma\s*\(", 1.0),
        Pattern(1, r"\bFUSED\b|fused", 0.5),
        Pattern(1, r"\btl\.store\s*\([^)]*\b(tl\.)?(where|maximum|exp|sigmoid)\b", 0.5),
        Pattern(2, r"online|ONLINE|running_(max|sum)|m_new|\bm_i\b|\bl_i\b|rescale", 1.0),
        Pattern(2, r"single[_ -]?pass|welford|Welford", 1.0),
        Pattern(3, r"\btl\.dot\s*\(", 1.0),
        Pattern(3, r"\bBLOCK_(SIZE_)?K\b", 0.5),
    ],
    "parallelism": [
        Pattern(1, r"\btl\.(sum|max|min|reduce|argmax|argmin|xor_sum)\s*\(", 1.0),
        Pattern(2, r"\bnum_warps\s*=\s*(8|16|32|\w+)", 0.5),
        Pattern(2, r"\btl\.(associative_scan|cumsum|cumprod|trans|permute|reshape|split|join)\s*\(", 0.5),
        Pattern(2, r"\btl\.(sum|max|min|reduce)\s*\([^)]*axis\s*=\s*1", 0.5),
        Pattern(3, r"\btl\.atomic_\w+\s*\(", 1.0),
        Pattern(3, r"\btl\.num_programs\s*\(", 1.0),
        Pattern(3, r"\btl\.program_id\s*\(\s*(axis\s*=\s*)?[12]\s*\)", 0.5),
    ],
}


def strip_python_comments(source: str) -> str:
    """``source`` with ``#`` comments and string literals (docstrings) blanked, so prose does not count."""
    lines = source.splitlines(keepends=True)
    try:
        tokens = [
            t
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type in (tokenize.COMMENT, tokenize.STRING)
        ]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.sub(r"#[^\n]*", " ", source)
    for tok in reversed(tokens):
        (r0, c0), (r1, c1) = tok.start, tok.end
        if r0 == r1:
            line = lines[r0 - 1]
            lines[r0 - 1] = line[:c0] + " " * (c1 - c0) + line[c1:]
        else:
            lines[r0 - 1] = lines[r0 - 1][:c0] + "\n"
            for r in range(r0, r1 - 1):
                lines[r] = "\n"
            lines[r1 - 1] = " " * c1 + lines[r1 - 1][c1:]
    return "".join(lines)


class TritonDescriptors(PatternDescriptors):
    """Pattern descriptors that read Python: ``#`` comments and strings are dropped, ``//`` is division."""

    def code(self, source: str) -> str:
        return strip_python_comments(source)


def triton_descriptors(measurer: Measurer | None = None) -> TritonDescriptors:
    return TritonDescriptors(language="triton", patterns=TRITON_PATTERNS, measurer=measurer)
