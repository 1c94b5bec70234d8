"""The evolvable prompt sections and their starting texts (meta-prompting rewrites them)."""

from __future__ import annotations

#: Section name -> heading shown in the prompt.
SECTION_TITLES: dict[str, str] = {
    "philosophy": "Optimisation philosophy",
    "strategies": "Strategies that work",
    "pitfalls": "Common pitfalls",
    "analysis": "How to analyse the parent",
}

DEFAULT_SECTIONS: dict[str, str] = {
    "philosophy": (
        "Correctness first, then memory traffic, then arithmetic. Most kernels are memory-bound: "
        "compare the parent's time with the least bytes it must move (and the roofline bound, where "
        "given) and attack whatever keeps it away from that bound. Prefer one clear idea per step over "
        "many half-done ones."
    ),
    "strategies": (
        "- Coalesce global accesses: neighbouring work-items touch neighbouring addresses; use vector "
        "loads (float4) where the size allows.\n"
        "- Give each work-item several outputs (work per thread) to amortise index arithmetic.\n"
        "- Stage reused data in local/shared memory tiles; synchronise with barriers.\n"
        "- Fuse passes: compute reductions in one pass (online softmax, Welford) instead of several.\n"
        "- Reduce across a work-group with a tree in local memory, or with sub-group/warp primitives.\n"
        "- Expose block sizes and tile sizes as template parameters (#define'd names in PARAMS)."
    ),
    "pitfalls": (
        "- Every output element must be written; guard the tail when the size is not a multiple of "
        "the block.\n"
        "- Never compute the result with torch ops in forward (allocation and reshaping are fine): "
        "such candidates are rejected.\n"
        "- A barrier inside a branch that not every work-item reaches hangs or corrupts the kernel.\n"
        "- The local/work-group size must divide the global size and respect the device limits."
    ),
    "analysis": (
        "Read the parent's verdict first. A compile error: fix exactly what the log names. A mismatch: "
        "look for races, missing barriers, wrong indexing, unwritten tails. A correct but slow kernel: "
        "estimate its bytes and FLOPs per output, find the bottleneck, and change the one thing that "
        "removes it."
    ),
}
