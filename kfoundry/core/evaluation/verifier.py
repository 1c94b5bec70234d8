"""Correctness verdicts for one trial, and the cross-trial input-independence check.

Checks, in order: output count and type, shape, dtype, elements never written (poison left),
inputs modified, constant output where the reference varies, NaN/Inf, then values within dtype-aware
tolerances (fp32/fp64 1e-4 abs and rel unless configured, fp16/bf16 1e-2, integers exact).

Every check runs where the tensors live (a GPU checks a 6 GiB KernelBench output in milliseconds; the
host would take seconds), and the float64 comparison goes in chunks so its temporaries stay bounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kfoundry.core.models import Outcome

LOW_PRECISION = {torch.float16, torch.bfloat16}

# Bound at import, before any candidate code runs in the worker (a candidate cannot re-point them).
_equal = torch.equal
_allclose = torch.allclose
_isnan = torch.isnan
_isfinite = torch.isfinite
_isclose = torch.isclose

#: Elements compared in float64 at a time (64 MiB per temporary).
COMPARE_CHUNK = 1 << 23


@dataclass
class Verdict:
    outcome: Outcome
    message: str


def tolerances(dtype: torch.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """(atol, rtol) for an output dtype; configured values win."""
    default = 1e-2 if dtype in LOW_PRECISION else (0.0 if not dtype.is_floating_point else 1e-4)
    return (default if atol is None else atol), (default if rtol is None else rtol)


def _unwritten(out: torch.Tensor, ref: torch.Tensor) -> int:
    """Elements still holding the poison (NaN where the reference has none)."""
    if out.dtype.is_floating_point:
        return int((_isnan(out) & ~_isnan(ref)).sum())
    return 0


def _is_constant(t: torch.Tensor) -> bool:
    flat = t.reshape(-1)
    return flat.numel() > 1 and bool((flat == flat[0]).all())


def check_trial(
    outputs: Sequence[Any],
    references: Sequence[Any],
    inputs: Sequence[Any],
    snapshots: Sequence[Any],
    atol: float | None,
    rtol: float | None,
) -> Verdict | None:
    """The first failure of one trial, or None when the trial passes."""
    if len(outputs) != len(references):
        return Verdict(Outcome.wrong_shape, f"returned {len(outputs)} outputs, expected {len(references)}")
    for i, (out, ref) in enumerate(zip(outputs, references, strict=True)):
        if not isinstance(ref, torch.Tensor):
            continue
        if type(out) is not torch.Tensor:
            return Verdict(
                Outcome.rejected, f"output {i} is a {type(out).__name__}, not a plain torch.Tensor"
            )
        if out.shape != ref.shape:
            return Verdict(
                Outcome.wrong_shape, f"output {i} has shape {list(out.shape)}, expected {list(ref.shape)}"
            )
        if out.dtype != ref.dtype:
            return Verdict(Outcome.mismatch, f"output {i} has dtype {out.dtype}, expected {ref.dtype}")
        if out.device != ref.device:
            return Verdict(Outcome.mismatch, f"output {i} is on {out.device}, expected {ref.device}")
    for i, (now, before) in enumerate(zip(inputs, snapshots, strict=True)):
        if isinstance(now, torch.Tensor) and not _equal(now, before) and not _same_with_nan(now, before):
            return Verdict(Outcome.rejected, f"the candidate modified input {i}")
    for i, (out, ref) in enumerate(zip(outputs, references, strict=True)):
        if not isinstance(ref, torch.Tensor):
            continue
        out, ref = out.detach(), ref.detach()
        missing = _unwritten(out, ref)
        if missing:
            return Verdict(
                Outcome.mismatch,
                f"output {i}: {missing} of {out.numel()} elements never written (poison remained)",
            )
        if _is_constant(out) and not _is_constant(ref):
            return Verdict(
                Outcome.rejected,
                f"output {i} is constant ({out.reshape(-1)[0].item():g}) but the reference varies",
            )
        if out.dtype.is_floating_point:
            bad = ~_isfinite(out) & _isfinite(ref)
            if bool(bad.any()):
                return Verdict(
                    Outcome.mismatch,
                    f"output {i}: {int(bad.sum())} NaN/Inf values where the reference is finite",
                )
        a, r = tolerances(ref.dtype, atol, rtol)
        off = _mismatches(out, ref, a, r)
        if off is not None:
            n_bad, worst = off
            flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
            return Verdict(
                Outcome.mismatch,
                f"output {i}: {n_bad} of {out.numel()} elements off (worst at flat index {worst}: "
                f"got {flat_out[worst].item():.6g}, expected {flat_ref[worst].item():.6g}; "
                f"atol={a:g}, rtol={r:g})",
            )
    return None


def check_outputs(
    outputs: Sequence[Any],
    references: Sequence[Any],
    references64: Sequence[Any] | None,
    atol: float | None,
    rtol: float | None,
) -> Verdict | None:
    """The first failure among outputs the judge read (shapes, dtypes and devices already checked):
    constant output where the reference varies, then values against the float64 ground truth with a
    tolerance calibrated on the reference's own error (:func:`~.tolerance.compare_output`)."""
    from kfoundry.core.evaluation.tolerance import compare_output

    if len(outputs) != len(references):
        return Verdict(Outcome.wrong_shape, f"returned {len(outputs)} outputs, expected {len(references)}")
    for i, (out, ref) in enumerate(zip(outputs, references, strict=True)):
        if not isinstance(ref, torch.Tensor):
            continue
        if (
            _is_constant(out)
            and not _is_constant(ref)
            and not bool(_isnan(ref).all() if ref.dtype.is_floating_point else False)
        ):
            return Verdict(
                Outcome.rejected,
                f"output {i} is constant ({out.reshape(-1)[0].item():g}) but the reference varies",
            )
        ref64 = None
        if references64 is not None and i < len(references64) and isinstance(references64[i], torch.Tensor):
            ref64 = references64[i]
        verdict = compare_output(i, out, ref, ref64, atol, rtol)
        if verdict is not None:
            return verdict
    return None


def _mismatches(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[int, int] | None:
    """(elements outside ``atol + rtol * |ref|``, flat index of the worst), or None when all are close.

    Compared in float64, ``COMPARE_CHUNK`` elements at a time; NaN matches NaN, as in ``allclose``.
    """
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    n_bad, worst, worst_diff = 0, -1, -1.0
    for start in range(0, flat_out.numel(), COMPARE_CHUNK):
        o = flat_out[start : start + COMPARE_CHUNK].double()
        r = flat_ref[start : start + COMPARE_CHUNK].double()
        bad = ~_isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)
        count = int(bad.sum())
        if not count:
            continue
        n_bad += count
        diff = torch.where(bad, torch.nan_to_num((o - r).abs(), nan=float("inf")), -1.0)
        at = int(diff.argmax())
        if float(diff[at]) > worst_diff:
            worst, worst_diff = start + at, float(diff[at])
    return (n_bad, worst) if n_bad else None


def _same_with_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype.is_floating_point
        and a.shape == b.shape
        and bool(_equal(torch.nan_to_num(a), torch.nan_to_num(b)))
    )


def check_independence(
    outputs_per_trial: Sequence[Sequence[Any]], refs_per_trial: Sequence[Sequence[Any]]
) -> Verdict | None:
    """Reject outputs identical across trials whose inputs (and reference outputs) differ."""
    for j in range(1, len(outputs_per_trial)):
        for i, (out, ref) in enumerate(zip(outputs_per_trial[j], refs_per_trial[j], strict=True)):
            prev_out, prev_ref = outputs_per_trial[0][i], refs_per_trial[0][i]
            if not isinstance(ref, torch.Tensor) or not isinstance(out, torch.Tensor):
                continue
            if _equal(out, prev_out) and not _equal(ref, prev_ref):
                return Verdict(
                    Outcome.rejected, f"output {i} does not depend on the input (identical across trials)"
                )
    return None
