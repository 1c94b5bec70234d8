"""Instruction mix of a compiled kernel: counts by class, weighted by loop depth.

A listing (SASS, PTX, AMDGPU ISA or LLVM IR) is a sequence of :class:`Instr` in program order plus
its control flow. An instruction inside ``d`` nested natural loops (found from the back edges of
the control-flow graph) counts
``LOOP_WEIGHT ** min(d, MAX_DEPTH)`` times: a static stand-in for how often it runs, so that the
inner loop of a matmul outweighs its prologue. What the compiler removed (comments, dead code, a
macro spelled another way) cannot count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

LOOP_WEIGHT = 8.0
MAX_DEPTH = 3

#: Instruction classes every listing parser maps onto.
CLASSES: tuple[str, ...] = (
    "fp32",
    "fp64",
    "fp16",
    "int",
    "sfu",
    "tensor",
    "global_load",
    "global_store",
    "readonly_load",
    "shared",
    "local",
    "shuffle",
    "barrier",
    "async_copy",
    "atomic",
    "other",
)


@dataclass(frozen=True)
class Instr:
    """One instruction: its class, FLOPs per lane, global bytes per lane, and whether it is a vector access."""

    cls: str
    flops: float = 0.0
    global_bytes: int = 0
    wide: bool = False


@dataclass
class Listing:
    """Instructions in program order with the control flow between them.

    ``branches`` holds (instruction index, target label); ``stops`` the indices of instructions
    after which control does not fall through (an unconditional branch, a return).
    """

    instrs: list[Instr] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)
    branches: list[tuple[int, str]] = field(default_factory=list)
    stops: set[int] = field(default_factory=set)

    def label(self, name: str) -> None:
        self.labels[name] = len(self.instrs)

    def add(self, instr: Instr, *, stop: bool = False) -> None:
        if stop:
            self.stops.add(len(self.instrs))
        self.instrs.append(instr)

    def branch(self, target: str) -> None:
        """A branch to ``target`` from the instruction added next."""
        self.branches.append((len(self.instrs), target))

    def successors(self) -> list[list[int]]:
        n = len(self.instrs)
        succ: list[list[int]] = [[] if i in self.stops or i + 1 >= n else [i + 1] for i in range(n)]
        for at, target in self.branches:
            dest = self.labels.get(target)
            if dest is not None and at < n and dest < n:
                succ[at].append(dest)
        return succ


@dataclass
class Mix:
    """Loop-weighted counts per class, FLOPs and global bytes (per thread or lane)."""

    counts: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0
    global_bytes: float = 0.0
    wide_accesses: float = 0.0
    max_depth: int = 0

    @property
    def total(self) -> float:
        return sum(self.counts.values())

    def share(self, *classes: str) -> float:
        """The weighted share of ``classes`` among all instructions (0 for an empty listing)."""
        total = self.total
        return sum(self.counts.get(c, 0.0) for c in classes) / total if total else 0.0

    def get(self, cls: str) -> float:
        return self.counts.get(cls, 0.0)


def loop_depths(listing: Listing) -> list[int]:
    """Per instruction, how many natural loops (one per loop header) contain it."""
    n = len(listing.instrs)
    if n == 0:
        return []
    succ = listing.successors()
    pred: list[list[int]] = [[] for _ in range(n)]
    for i, targets in enumerate(succ):
        for j in targets:
            pred[j].append(i)
    back: list[tuple[int, int]] = []  # (latch, header): edges to a node on the DFS stack
    state = [0] * n  # 0 unseen, 1 on stack, 2 done
    stack = [(0, 0)]
    state[0] = 1
    while stack:
        node, k = stack[-1]
        if k < len(succ[node]):
            stack[-1] = (node, k + 1)
            nxt = succ[node][k]
            if state[nxt] == 1:
                back.append((node, nxt))
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, 0))
        else:
            state[node] = 2
            stack.pop()
    bodies: dict[int, set[int]] = {}
    for latch, header in back:
        body = bodies.setdefault(header, {header})
        todo = [latch]
        while todo:
            m = todo.pop()
            if m in body:
                continue
            body.add(m)
            todo.extend(pred[m])
    depth = [0] * n
    for body in bodies.values():
        for m in body:
            depth[m] += 1
    return depth


def weigh(listings: Iterable[Listing]) -> Mix:
    """The loop-weighted :class:`Mix` of one or more listings (one per kernel of a program)."""
    counts: dict[str, float] = defaultdict(float)
    mix = Mix()
    for listing in listings:
        for instr, d in zip(listing.instrs, loop_depths(listing), strict=True):
            w = LOOP_WEIGHT ** min(d, MAX_DEPTH)
            counts[instr.cls] += w
            mix.flops += instr.flops * w
            mix.global_bytes += instr.global_bytes * w
            mix.wide_accesses += w if instr.wide else 0.0
            mix.max_depth = max(mix.max_depth, d)
    mix.counts = dict(counts)
    return mix
