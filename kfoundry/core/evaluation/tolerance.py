"""Correctness of one output against a float64 ground truth, calibrated by the reference's own error.

Where the float64 reference ``ref64`` exists, the native-dtype reference's error ``e_ref = |ref - ref64|``
says how accurate an honest computation in that dtype can be. The candidate's error ``e_out = |out -
ref64|`` must stay within two bounds:

- **per element** (outliers): ``e_out[i] <= ELEMENT_RATIO * s[i]``, where ``s[i]`` is the RMS of
  ``e_ref`` over elements of the same binade of ``|ref64|`` (pooled upward to ``MIN_POOL`` elements, made
  non-decreasing in magnitude), floored at 1 ulp of ``|ref64[i]|``; and never below ``FLOOR_ULPS`` ulps of
  ``rms(ref64)`` (outputs near zero after cancellation) or the dtype's smallest normal number (flushed
  subnormals);
- **RMS** (systematic precision loss): ``rms(e_out) <= max(RMS_RATIO * rms(e_ref), RMS_ULPS * eps *
  rms(ref64))``.

fp16/bf16 outputs use their own ``eps`` with tighter ratios (``LOW_PRECISION_BOUNDS``).

Dropped mantissa bits, TF32/bf16 inputs and approximations fail; an honest reordering of a sum passes
(a sequential fp32 sum of 16384 terms has an RMS error of ~14 ulps, the bound is 64). Everything runs
where the tensors live, ``COMPARE_CHUNK`` elements at a time, so temporaries stay bounded whatever the
output size. Explicit ``atol``/``rtol`` replace the calibrated bounds; integers and bools compare exactly.

Most outputs are accepted in one pass of sums (``_clearly_within``): the per-element bound is never below
``ELEMENT_RATIO`` ulps of the element's own magnitude nor below the floor, so an output within those and
within the RMS bound (with a margin for summation order) passes; the rest get the exact two passes, whose
numbers do not depend on having tried the one pass.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from kfoundry.core.evaluation.error_envelope import (
    COMPARE_CHUNK,
    Assessment,
    _aminmax,
    _calibrated_verdict,
    _clearly_within,
    _dtype,
    _equal,
    _Errors,
    _fmt,
    _isfinite,
    _isinf,
    _isnan,
    assess,
)
from kfoundry.core.evaluation.verifier import Verdict, tolerances
from kfoundry.core.models import Outcome
from kfoundry.core.problem import as_tensor_list

__all__ = ["COMPARE_CHUNK", "Assessment", "assess", "compare_output", "float64_reference"]


def float64_reference(model: nn.Module, inputs: list[Any]) -> list[Any] | None:
    """The reference's outputs computed in float64, or None when that fails or gives no floating output.

    A deep copy of ``model`` is cast with ``.double()`` (floating parameters and buffers) and run on copies
    of the inputs with floating tensors cast to float64; ``model`` and ``inputs`` are left untouched.
    """
    try:
        model64 = copy.deepcopy(model).double()
        args = [_to_float64(x) for x in inputs]
        with torch.no_grad():
            outputs = as_tensor_list(model64(*args))
    except Exception:
        return None
    if not any(isinstance(o, torch.Tensor) and o.dtype.is_floating_point for o in outputs):
        return None
    return outputs


def _to_float64(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64, copy=True) if x.dtype.is_floating_point else x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_to_float64(v) for v in x)
    return x


def compare_output(
    index: int,
    out: torch.Tensor,
    ref: torch.Tensor,
    ref64: torch.Tensor | None,
    atol: float | None,
    rtol: float | None,
) -> Verdict | None:
    """A mismatch verdict for output ``index``, or None when ``out`` is correct.

    ``out`` and ``ref`` have the same shape, dtype and device. ``ref64`` (float64, same shape) enables
    the calibrated criterion (module docstring); configured ``atol``/``rtol`` are used instead when given.
    """
    out, ref = out.detach(), ref.detach()
    if not ref.dtype.is_floating_point:
        return _exact(index, out, ref)
    truth = None
    if isinstance(ref64, torch.Tensor) and ref64.dtype == torch.float64 and ref64.shape == ref.shape:
        truth = ref64.detach()
    errors = _Errors(out, ref, truth) if truth is not None and atol is None and rtol is None else None
    if errors is not None and _clearly_within(errors):
        return None  # everything finite, so no non-finite verdict either
    verdict = _nonfinite(index, out, ref)
    if verdict is not None:
        return verdict
    if errors is None:
        a, r = tolerances(ref.dtype, atol, rtol)
        return _explicit(index, out, ref, truth, a, r)
    return _calibrated_verdict(index, errors)


def _chunks(*tensors: torch.Tensor) -> Any:
    """(start, flat float64 chunks on the first tensor's device) over equally sized tensors.

    The first two chunks are fresh copies (callers work on them in place); the third may be a view.
    """
    device = tensors[0].device
    flats = [t.reshape(-1) for t in tensors]
    for start in range(0, flats[0].numel(), COMPARE_CHUNK):
        yield (
            start,
            [
                f[start : start + COMPARE_CHUNK].to(device=device, dtype=torch.float64, copy=k < 2)
                for k, f in enumerate(flats)
            ],
        )


def _exact(index: int, out: torch.Tensor, ref: torch.Tensor) -> Verdict | None:
    if _equal(out, ref):
        return None
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    n_bad, first = 0, -1
    for start in range(0, flat_ref.numel(), COMPARE_CHUNK):
        bad = flat_out[start : start + COMPARE_CHUNK] != flat_ref[start : start + COMPARE_CHUNK]
        count = int(bad.sum())
        if count and first < 0:
            first = start + int(bad.nonzero()[0, 0])
        n_bad += count
    return Verdict(
        Outcome.mismatch,
        f"output {index}: {n_bad} of {ref.numel()} elements differ (first at flat index {first}: "
        f"got {flat_out[first].item()}, expected {flat_ref[first].item()}; {ref.dtype} compares exactly)",
    )


def _nonfinite(index: int, out: torch.Tensor, ref: torch.Tensor) -> Verdict | None:
    """Non-finite exactly where the reference is, and never the opposite infinity.

    Where the reference is NaN an infinity is accepted (and NaN where it is infinite): which of the
    two an honest kernel produces from an infinite input depends on the order of its operations
    (``inf - inf`` in a variance, ``inf * 0`` in a sum). A finite value where the reference is not, or
    a non-finite one where it is finite, is a mismatch.
    """
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    kinds = (
        "NaN/inf values where the reference is finite",
        "finite values where the reference is NaN",
        "values where the reference is infinite that are finite or the opposite infinity",
    )
    counts, firsts = [0, 0, 0], [-1, -1, -1]
    for start in range(0, flat_ref.numel(), COMPARE_CHUNK):
        o, r = flat_out[start : start + COMPARE_CHUNK], flat_ref[start : start + COMPARE_CHUNK]
        if _all_finite(o) and _all_finite(r):
            continue
        o_nan, r_nan, r_inf = _isnan(o), _isnan(r), _isinf(r)
        o_fin = _isfinite(o)
        masks = (~o_fin & _isfinite(r), r_nan & o_fin, r_inf & ~o_nan & (o != r))
        for k, mask in enumerate(masks):
            count = int(mask.sum())
            if count and firsts[k] < 0:
                firsts[k] = start + int(mask.nonzero()[0, 0])
            counts[k] += count
    for k, kind in enumerate(kinds):
        if counts[k]:
            at = firsts[k]
            return Verdict(
                Outcome.mismatch,
                f"output {index}: {counts[k]} {kind} (first at flat index {at}: "
                f"got {_fmt(flat_out[at].item())}, expected {_fmt(flat_ref[at].item())})",
            )
    return None


def _all_finite(x: torch.Tensor) -> bool:
    """Whether a non-empty tensor holds no NaN or inf: its min and max are finite (they propagate NaN).

    One reduction without temporaries, where ``torch.isfinite(x).all()`` writes a mask first.
    """
    low, high = _aminmax(x)
    return math.isfinite(float(low)) and math.isfinite(float(high))


def _explicit(
    index: int, out: torch.Tensor, ref: torch.Tensor, ref64: torch.Tensor | None, atol: float, rtol: float
) -> Verdict | None:
    """``|out - truth| <= atol + rtol * |truth|`` at every finite element.

    The truth is ``ref64`` where given (plus the reference's own error there, so the reference itself
    always passes), else ``ref`` (as ``torch.isclose``).
    """
    n_bad, worst, worst_err = 0, -1, -1.0
    tensors = (out, ref) if ref64 is None else (out, ref, ref64)
    for start, chunk in _chunks(*tensors):
        o, r = chunk[0], chunk[1]
        fin = _isfinite(r)
        if ref64 is None:
            t, slack = r, torch.zeros((), dtype=torch.float64, device=r.device)
        else:
            t64 = chunk[2]
            good = _isfinite(t64)
            t = torch.where(good, t64, r)
            slack = torch.where(good & fin, (r - t64).abs(), 0.0)
        err = torch.where(fin, (o - t).abs(), 0.0)
        bad = err > atol + rtol * t.abs() + slack
        del chunk, o, r, t, slack
        count = int(bad.sum())
        if not count:
            continue
        n_bad += count
        at = int(torch.where(bad, err, -1.0).argmax())
        if float(err[at]) > worst_err:
            worst, worst_err = start + at, float(err[at])
    if not n_bad:
        return None
    against = "float64 reference" if ref64 is not None else f"{_dtype(ref)} reference"
    expected = (ref64 if ref64 is not None else ref).reshape(-1)[worst].item()
    return Verdict(
        Outcome.mismatch,
        f"output {index}: {n_bad} of {out.numel()} elements off the {against} (worst at flat index {worst}: "
        f"got {_fmt(out.reshape(-1)[worst].item())}, expected {_fmt(expected)}; atol={atol:g}, rtol={rtol:g})",
    )
