"""Which trials the judge runs: other sizes, other input distributions, unaligned inputs.

:func:`plan_trials` derives up to two alternative shape sets of a KernelBench problem ("tiny": small odd
sizes; "ragged": sizes off every multiple of 4..64), each validated by running the reference on the meta
device, and lists the structured trials. :func:`transform_inputs` redraws floating inputs from another
distribution, :func:`domain_reason` says when such inputs leave the reference's domain, and
:func:`unaligned_copy` moves a tensor's start off a 64-byte boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kfoundry.core.problem import Problem, as_tensor_list, load_problem

DISTRIBUTIONS = ("problem", "signed", "normal", "large", "tiny", "nonfinite")

#: Distinct small odd sizes for the "tiny" variant (fewer than 32 along each altered dimension).
TINY_SIZES = (7, 11, 13, 17, 19, 23, 29, 31, 9, 15, 21, 25, 27)
#: Largest size of the "ragged" variant.
RAGGED_CAP = 300
#: Relative RMS error of the native reference against float64 beyond which inputs are ill-conditioned.
ILL_CONDITIONED = 1e-2


@dataclass(frozen=True)
class TrialSpec:
    """One structured trial: shape set ``variant`` (index into ``TrialPlan.variants``), input distribution."""

    variant: int
    distribution: str
    aligned: bool = True
    label: str = ""


@dataclass
class TrialPlan:
    """Shape sets (``variants[0]``: the problem's own), why no others exist, and the structured trials."""

    variants: list[dict[str, int | float]]
    fixed_shape_reason: str | None
    structured: list[TrialSpec]


@dataclass
class _Run:
    input_elements: int
    output_shapes: list[list[int]]
    element_size: int


def plan_trials(problem: Problem, max_elements: int = 1 << 16) -> TrialPlan:
    """The trial plan for ``problem``: alternative sizes (KernelBench only) with at most ``max_elements``
    input elements, and the structured trials over all variants."""
    base = dict(problem.shapes)
    variants: list[dict[str, int | float]] = [base]
    names: list[str] = ["as configured"]
    reason: str | None
    run0: _Run | None = None
    if problem.format == "native":
        reason = "native task: sizes are fixed by the kernel source and its launch geometry"
    else:
        sizes = {k: v for k, v in base.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 16}
        reason = None if sizes else "no size constant >= 16"
        failures: list[str] = []
        if sizes:
            run0 = _validate(problem, base, failures)
            if run0 is None:
                reason = f"the reference fails at its own sizes: {failures[0]}"
        if sizes and run0 is not None:
            for kind in ("tiny", "ragged"):
                found = _variant(problem, base, sizes, kind, run0, max_elements, failures)
                if found is not None:
                    variant, run = found
                    variants.append(variant)
                    changed = ", ".join(f"{k}={variant[k]}" for k in sizes)
                    names.append(f"{kind}: {changed}")
            if len(variants) == 1:
                reason = failures[0] if failures else "no alternative sizes"
    esize = run0.element_size if run0 is not None else 4
    off = f"start {esize} bytes off alignment"
    structured = [TrialSpec(0, d, True, f"variant 0 ({names[0]}), {d} inputs") for d in DISTRIBUTIONS[1:]]
    structured.append(TrialSpec(0, "problem", False, f"variant 0 ({names[0]}), problem inputs, {off}"))
    for i in range(1, len(variants)):
        structured.append(TrialSpec(i, "problem", True, f"variant {i} ({names[i]}), problem inputs"))
        structured.append(TrialSpec(i, "problem", False, f"variant {i} ({names[i]}), problem inputs, {off}"))
    return TrialPlan(variants=variants, fixed_shape_reason=reason, structured=structured)


def _variant(
    problem: Problem,
    base: dict[str, int | float],
    sizes: dict[str, int],
    kind: str,
    run0: _Run,
    max_elements: int,
    failures: list[str],
) -> tuple[dict[str, int | float], _Run] | None:
    """The first valid ``kind`` variant: odd sizes, else sizes that are 2 mod 4 (e.g. a size halved)."""
    for residue in (3, 2):
        chosen = {k: _size(kind, v, j, residue) for j, (k, v) in enumerate(sizes.items())}
        for _ in range(64):  # shrink ragged sizes by 64 or 4 (same residues) until the inputs fit
            variant = {**base, **chosen}
            run = _validate(problem, variant, failures)
            if run is None:
                break
            if run.output_shapes == run0.output_shapes:
                failures.append(f"the output shape does not change with the size constants ({kind} sizes)")
                break
            if run.input_elements <= max_elements:
                return variant, run
            biggest = max(chosen, key=lambda k: chosen[k])
            step = 64 if chosen[biggest] >= 128 + residue else 4
            if kind == "tiny" or chosen[biggest] - step < 7:
                failures.append(f"the inputs exceed {max_elements} elements even at {kind} sizes")
                break
            chosen[biggest] -= step
    return None


def _size(kind: str, original: int, j: int, residue: int) -> int:
    """The ``j``-th constant's ``kind`` size: odd (``residue`` 3) or 2 mod 4 (``residue`` 2)."""
    if kind == "tiny":
        odd = TINY_SIZES[j % len(TINY_SIZES)]
        return odd if residue == 3 else odd - 1 if odd % 4 == 3 else odd + 1
    cap = min(original, RAGGED_CAP)
    top = cap - (cap - residue) % 64 if cap >= 64 + residue else cap - (cap - residue) % 4
    return max(top - 4 * j, 4 + residue)


def _validate(problem: Problem, variant: dict[str, int | float], failures: list[str]) -> _Run | None:
    """Input elements and output shapes of the reference at ``variant`` (meta device, else the CPU)."""
    try:
        loaded = load_problem(problem.path, variant)
    except Exception as exc:
        failures.append(f"the problem does not load at other sizes: {_one_line(exc)}")
        return None
    error = ""
    for device in ("meta", "cpu"):
        try:
            with torch.random.fork_rng(devices=[]), torch.device(device):
                inputs = loaded.make_inputs(0)
                model = loaded.make_reference()
                with torch.no_grad():
                    outputs = as_tensor_list(model(*inputs))
        except Exception as exc:
            error = error or _one_line(exc)
            if device == "cpu" or "meta" not in str(exc).lower():
                break
            continue
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        return _Run(
            input_elements=sum(t.numel() for t in tensors),
            output_shapes=[list(t.shape) for t in outputs if isinstance(t, torch.Tensor)],
            element_size=tensors[0].element_size() if tensors else 4,
        )
    sizes = ", ".join(f"{k}={v}" for k, v in variant.items() if v != problem.shapes.get(k))
    failures.append(f"the reference fails at other sizes ({sizes}): {error}")
    return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def transform_inputs(inputs: list[Any], distribution: str, generator: torch.Generator) -> list[Any]:
    """``inputs`` with every floating tensor redrawn from ``distribution`` (see ``DISTRIBUTIONS``).

    Values come from ``generator`` (deterministic); shape, dtype and device are kept; integer and bool
    tensors and non-tensors are passed through. "problem" is the identity.
    """
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r} (known: {', '.join(DISTRIBUTIONS)})")
    if distribution == "problem":
        return list(inputs)
    return [
        _transform(x, distribution, generator)
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point
        else x
        for x in inputs
    ]


def _transform(x: torch.Tensor, distribution: str, g: torch.Generator) -> torch.Tensor:
    draw = torch.float64 if x.dtype == torch.float64 else torch.float32
    if distribution == "nonfinite":
        out = x.detach().clone().contiguous()
        flat = out.view(-1)
        n = flat.numel()
        if n:
            count = min(n, max(3, n // 1000))
            if n <= 1 << 24:
                where = torch.randperm(n, generator=g, device=g.device)[:count]
            else:
                where = torch.randint(n, (count,), generator=g, device=g.device).unique()
            where = where.to(out.device)
            flat[where[0::3]] = math.nan
            flat[where[1::3]] = math.inf
            flat[where[2::3]] = -math.inf
        return out
    scale = float(x.detach().abs().max()) if x.numel() else 1.0
    if not math.isfinite(scale) or scale == 0:
        scale = 1.0
    if distribution == "normal":
        values = torch.randn(x.shape, generator=g, device=g.device, dtype=draw)
    else:
        values = torch.rand(x.shape, generator=g, device=g.device, dtype=draw).mul_(2).sub_(1)
    factor = scale
    if distribution == "large":
        factor *= 1e2 if x.dtype == torch.float16 else 1e4
    elif distribution == "tiny":
        factor *= 1e-4 if x.dtype == torch.float16 else 1e-20
    return values.mul_(factor).to(device=x.device, dtype=x.dtype)


def domain_reason(ref: list[Any], ref64: list[Any] | None) -> str | None:
    """Why inputs lie outside the reference's domain, or None when they are inside it.

    Outside: the native reference is not finite where the float64 one is, or the other way round
    (positions where both are not finite are left to the non-finite check), or its relative RMS error
    against float64 exceeds ``ILL_CONDITIONED``.
    """
    if ref64 is None:
        return None
    from kfoundry.core.evaluation.tolerance import COMPARE_CHUNK

    for i, (r, r64) in enumerate(zip(ref, ref64, strict=False)):
        if not (isinstance(r, torch.Tensor) and isinstance(r64, torch.Tensor)):
            continue
        if not r.dtype.is_floating_point or r.shape != r64.shape:
            continue
        name = str(r.dtype).removeprefix("torch.")
        flat, flat64 = r.detach().reshape(-1), r64.detach().reshape(-1)
        err2 = norm2 = 0.0
        for start in range(0, flat.numel(), COMPARE_CHUNK):
            a = flat[start : start + COMPARE_CHUNK].to(torch.float64)
            b = flat64[start : start + COMPARE_CHUNK].to(device=a.device, dtype=torch.float64)
            fa, fb = torch.isfinite(a), torch.isfinite(b)
            for mask, what in (
                (fb & ~fa, f"the {name} reference is not finite where the float64 one is"),
                (fa & ~fb, f"the float64 reference is not finite where the {name} one is"),
            ):
                if bool(mask.any()):
                    at = int(mask.nonzero()[0, 0])
                    return (
                        f"output {i}: {what} ({int(mask.sum())} elements; e.g. flat index {start + at}: "
                        f"{float(a[at]):.4g} vs {float(b[at]):.4g})"
                    )
            both = fa & fb
            err2 += float(torch.where(both, a - b, 0.0).square().sum())
            norm2 += float(torch.where(both, b, 0.0).square().sum())
        rel = math.sqrt(err2 / norm2) if norm2 > 0 else (math.inf if err2 > 0 else 0.0)
        if rel > ILL_CONDITIONED:
            return (
                f"output {i}: the {name} reference's relative RMS error against float64 is {rel:.3g} "
                f"(over {ILL_CONDITIONED:g}: ill-conditioned for these inputs)"
            )
    return None


def unaligned_copy(t: torch.Tensor, offset_elems: int = 1) -> torch.Tensor:
    """A contiguous copy of ``t`` starting ``offset_elems`` elements past a 64-byte aligned address."""
    esize = t.element_size()
    numel = t.numel()
    buf = torch.empty(numel + 64 // esize + offset_elems + 1, dtype=t.dtype, device=t.device)
    k = ((-buf.data_ptr()) % 64) // esize + offset_elems
    out = buf[k : k + numel].view(t.shape)
    out.copy_(t)
    return out
