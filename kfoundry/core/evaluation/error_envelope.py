"""The calibrated error envelope: per-binade bounds from the reference's own error, one-pass and exact checks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kfoundry.core.evaluation.binades import _NBINS, _TRASH, _envelope, _exponents, _first, _truth
from kfoundry.core.evaluation.verifier import LOW_PRECISION, Verdict
from kfoundry.core.models import Outcome

# Bound at import, before any candidate code runs in the worker.
_isnan = torch.isnan


_isinf = torch.isinf


_isfinite = torch.isfinite


_equal = torch.equal


_aminmax = torch.aminmax


_amax = torch.amax


_abs = torch.abs


_maximum = torch.maximum


_div = torch.div


_index_select = torch.index_select


_bincount = torch.bincount


_nonzero = torch.nonzero


_vector_norm = torch.linalg.vector_norm


#: Elements compared in float64 at a time (64 MiB per temporary).
COMPARE_CHUNK = 1 << 23


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


#: Per-element bound, in units of the reference's own error scale at that magnitude.
ELEMENT_RATIO = 256.0


#: Per-element absolute floor, in ulps (``eps``) of ``rms(ref64)``.
FLOOR_ULPS = 16.0


#: RMS bound, in units of the reference's own RMS error...
RMS_RATIO = 8.0


#: ...and never below this many ulps of ``rms(ref64)``.
RMS_ULPS = 64.0


#: (ELEMENT_RATIO, FLOOR_ULPS, RMS_ULPS) for fp16/bf16 outputs, whose reference error is mostly the final
#: rounding (torch accumulates them in fp32): slack for longer fp32 sums would be whole fp16/bf16 bits.
LOW_PRECISION_BOUNDS = (16.0, 1.0, 2.0)


@dataclass
class Assessment:
    """The calibrated criterion's numbers for one output (``compare_output`` turns them into a verdict)."""

    element_ratio: float  # max over elements of e_out / per-element bound (> 1 fails)
    element_index: int  # flat index of that element
    element_scale: float  # the reference's error scale at that element
    element_error: float
    rms_error: float  # rms(e_out)
    rms_ref_error: float  # rms(e_ref)
    rms_bound: float
    rms_worst_index: int  # flat index of the largest e_out
    element_limit: float  # the per-element ratio in force (ELEMENT_RATIO, or its fp16/bf16 value)
    rms_ulps: float  # the RMS floor in force, in ulps of rms(ref64)

    @property
    def rms_ratio(self) -> float:
        """rms(e_out) / the RMS bound (> 1 fails)."""
        return (
            self.rms_error / self.rms_bound if self.rms_bound > 0 else (math.inf if self.rms_error else 0.0)
        )

    @property
    def worst(self) -> float:
        """The larger of the two ratios: how far the output is from failing (< 1) or past it."""
        return max(self.element_ratio, self.rms_ratio)


def assess(out: torch.Tensor, ref: torch.Tensor, ref64: torch.Tensor) -> Assessment:
    """Both calibrated bounds for a floating ``out`` (non-finite values already matched to ``ref``).

    Two passes over ``COMPARE_CHUNK``-element chunks (statistics, then the per-element bound) in
    chunk-sized float64 buffers: about 250 MiB of temporaries at most.
    """
    return _assess(_Errors(out.detach(), ref.detach(), ref64.detach()))


def _bounds(dtype: torch.dtype) -> tuple[float, float, float]:
    """(element ratio, floor in ulps, RMS floor in ulps) for outputs of ``dtype``."""
    return LOW_PRECISION_BOUNDS if dtype in LOW_PRECISION else (ELEMENT_RATIO, FLOOR_ULPS, RMS_ULPS)


class _Errors:
    """``out``, ``ref`` and ``ref64`` flattened, with chunk-sized buffers reused across the passes.

    ``error(name, start)`` is ``|x - ref64|`` in float64 over the chunk at ``start`` (``x`` the output
    for ``"out"``, the reference for ``"ref"``), kept in its buffer until ``scratch(name, start)`` hands
    that buffer out for overwriting: with one chunk, each error is converted and computed once per
    comparison whatever the number of passes. ``bins(start)`` likewise keeps the chunk's exponents.
    """

    def __init__(self, out: torch.Tensor, ref: torch.Tensor, ref64: torch.Tensor) -> None:
        self.out, self.ref, self.truth64 = out.reshape(-1), ref.reshape(-1), ref64.reshape(-1)
        self.dtype, self.device, self.n = ref.dtype, out.device, self.ref.numel()
        self.same = bool(_equal(self.out, self.ref))  # stops at the first difference
        self._size = min(self.n, COMPARE_CHUNK)
        self._buffers: dict[str, torch.Tensor] = {}
        self._held: dict[str, int] = {}
        self._norms: dict[int, tuple[float, float, float]] = {}

    def norms(self, start: int) -> tuple[float, float, float]:
        """The 2-norms of the truth, the reference's error and the output's error over the chunk at ``start``."""
        norms = self._norms.get(start)
        if norms is None:
            e_ref = self.error("ref", start)
            norm_r = float(_vector_norm(e_ref))
            norm_o = norm_r if self.same else float(_vector_norm(self.error("out", start)))
            norms = self._norms[start] = (float(_vector_norm(self.truth(start))), norm_r, norm_o)
        return norms

    def starts(self) -> range:
        return range(0, self.n, COMPARE_CHUNK)

    def truth(self, start: int) -> torch.Tensor:
        return self.truth64[start : start + COMPARE_CHUNK].to(self.device)

    def _buffer(self, name: str, start: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        buffer = self._buffers.get(name)
        if buffer is None:
            buffer = self._buffers[name] = torch.empty(self._size, dtype=dtype, device=self.device)
        return buffer[: min(COMPARE_CHUNK, self.n - start)]

    def error(self, name: str, start: int) -> torch.Tensor:
        buffer = self._buffer(name, start)
        if self._held.get(name) != start:
            other = "ref" if name == "out" else "out"
            if self.same and self._held.get(other) == start:
                buffer.copy_(self._buffer(other, start))
            else:
                x = self.out if name == "out" else self.ref
                buffer.copy_(x[start : start + COMPARE_CHUNK]).sub_(self.truth(start)).abs_()
            self._held[name] = start
        return buffer

    def scratch(self, name: str, start: int) -> torch.Tensor:
        self._held.pop(name, None)
        return self._buffer(name, start)

    def bins(self, start: int) -> torch.Tensor:
        """The chunk's truth's biased exponents (``_exponents``), the truth being finite there."""
        buffer = self._buffer("bins", start, torch.int32)
        if self._held.get("bins") != start:
            _exponents(self.truth(start), out=buffer)
            self._held["bins"] = start
        return buffer

    def copies(self, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fresh float64 copies of the output's and the reference's chunk, and the truth's chunk."""
        chunk = slice(start, start + COMPARE_CHUNK)
        o, r = (x[chunk].to(device=self.device, dtype=torch.float64, copy=True) for x in (self.out, self.ref))
        return o, r, self.truth(start)


#: The one-pass acceptance (``_clearly_within``) takes only outputs at least this far inside both bounds,
#: so that sums accumulated in another order than ``assess``'s cannot turn a verdict.
_QUICK_MARGIN = 1.0 - 2.0**-20


def _clearly_within(errors: _Errors) -> bool:
    """True when the output certainly passes the calibrated criterion; False: ``assess`` decides.

    One pass of sums without the per-magnitude statistics: the RMS bound with the sum of the reference's
    squared errors, and the per-element bound, which is never below ``element ratio`` ulps of the element's
    own magnitude nor below the floor (a second pass compares with the former only when the largest
    error exceeds the latter). Anything not finite is left to ``assess``.
    """
    element_ratio, floor_ulps, rms_ulps = _bounds(errors.dtype)
    info = torch.finfo(errors.dtype)
    eps, tiny = float(info.eps), float(info.tiny)
    sum_t2 = sum_r2 = sum_o2 = max_err = 0.0
    for start in errors.starts():
        norm_t, norm_r, norm_o = errors.norms(start)
        sum_t2 += norm_t**2
        sum_r2 += norm_r**2
        sum_o2 += norm_o**2
        max_err = max(max_err, float(_amax(errors.error("ref" if errors.same else "out", start))))
    if not (math.isfinite(sum_t2) and math.isfinite(sum_r2) and math.isfinite(sum_o2)):
        return False
    n = max(errors.n, 1)
    rms_t = math.sqrt(sum_t2 / n)
    rms_bound = max(RMS_RATIO * math.sqrt(sum_r2 / n), rms_ulps * eps * rms_t, tiny)
    if math.sqrt(sum_o2 / n) > _QUICK_MARGIN * rms_bound:
        return False
    floor = _QUICK_MARGIN * max(floor_ulps * eps * rms_t, tiny)
    if max_err <= floor:
        return True
    for start in errors.starts():
        e_out = errors.error("ref" if errors.same else "out", start)
        bound = errors.scratch("spare", start)
        _abs(errors.truth(start), out=bound).mul_(_QUICK_MARGIN * element_ratio * eps).clamp_(min=floor)
        if float(_amax(bound.sub_(e_out).neg_())) > 0:  # subtraction keeps the sign exactly
            return False
    return True


def _assess(errors: _Errors) -> Assessment:
    """``assess`` on prepared errors: chunks where everything is finite take the buffered way."""
    info = torch.finfo(errors.dtype)
    eps, tiny = float(info.eps), float(info.tiny)
    element_ratio, floor_ulps, rms_ulps = _bounds(errors.dtype)
    device = errors.device
    counts = torch.zeros(_NBINS, dtype=torch.float64, device=device)
    sq_ref = torch.zeros(_NBINS, dtype=torch.float64, device=device)
    sum_t2 = sum_o2 = 0.0
    n = 0
    max_err, max_at = -1.0, 0
    finite: list[bool] = []
    for start in errors.starts():
        norm_t, norm_r, norm_o = errors.norms(start)
        finite.append(math.isfinite(norm_t) and math.isfinite(norm_r) and math.isfinite(norm_o))
        if finite[-1]:  # as below, with t = t64 and fin = None
            t64 = errors.truth(start)
            e_out = errors.error("out", start)
            e_ref = errors.error("ref", start)
            bins = errors.bins(start)
            errors.scratch("ref", start)  # e_ref is squared in place
            n += t64.numel()
            sum_t2 += norm_t**2
            counts += _bincount(bins, minlength=_NBINS).to(torch.float64)
            sq_ref += _bincount(bins, weights=e_ref.square_(), minlength=_NBINS)
            sum_o2 += norm_o**2
            err = float(_amax(e_out))
            if err > max_err:
                max_err, max_at = err, start + _first(e_out, err)
            continue
        o, r, t64 = errors.copies(start)
        t, bins, fin = _truth(r, t64)
        e_ref = r.sub_(t).abs_()
        e_out = o.sub_(t).abs_()
        if fin is not None:
            e_ref.masked_fill_(~fin, 0.0)
            e_out.masked_fill_(~fin, 0.0)
            n += int(fin.sum())
            sum_t2 += float(_vector_norm(torch.where(fin, t, 0.0))) ** 2
        else:
            n += t.numel()
            sum_t2 += float(_vector_norm(t)) ** 2
        counts += _bincount(bins, minlength=_NBINS).to(torch.float64)
        sq_ref += _bincount(bins, weights=e_ref.square_(), minlength=_NBINS)
        sum_o2 += float(_vector_norm(e_out)) ** 2
        err = float(_amax(e_out))
        if err > max_err:
            max_err, max_at = err, start + _first(e_out, err)
        del o, r, t64, t, bins, fin, e_ref, e_out  # before the next chunk is converted
    n = max(n, 1)
    counts[_TRASH] = 0.0
    sq_ref[_TRASH] = 0.0
    rms_t = math.sqrt(sum_t2 / n)
    rms_ref = math.sqrt(float(sq_ref.sum()) / n)
    env = _envelope(counts.cpu(), sq_ref.cpu()).to(device)
    floor = max(floor_ulps * eps * rms_t, tiny)
    # The bound max(element_ratio * max(env[bin], eps * |t|), floor) as max(limit[bin], element_ratio *
    # eps * |t|): the same number, rounding being monotonic.
    limit = (env * element_ratio).clamp_(min=floor)
    worst_ratio, worst_at, worst_scale, worst_err = 0.0, 0, 0.0, 0.0
    for k, start in enumerate(errors.starts()):
        if finite[k]:
            t = errors.truth(start)
            bins = errors.bins(start)
            e_out = errors.error("out", start)
            bound = _abs(t, out=errors.scratch("ref", start)).mul_(eps).mul_(element_ratio)
            _maximum(bound, _index_select(limit, 0, bins, out=errors.scratch("spare", start)), out=bound)
            ratio = _div(e_out, bound, out=bound)
        else:
            o, r, t64 = errors.copies(start)
            t, bins, fin = _truth(r, t64)
            e_out = o.sub_(t).abs_()
            if fin is not None:
                e_out.masked_fill_(~fin, 0.0)
            scale = env[bins]
            _maximum(scale, r.copy_(t).abs_().mul_(eps), out=scale)
            ratio = e_out.div_(scale.mul_(element_ratio).clamp_(min=floor))
            del o, r, t64, fin, e_out, scale
        top = float(_amax(ratio))
        if top > worst_ratio:
            at = _first(ratio, top)
            worst_ratio, worst_at = top, start + at
            worst_scale = max(float(env[bins[at]]), eps * abs(float(t[at])))
            worst_err = abs(float(errors.out[start + at]) - float(t[at]))
        del t, bins, ratio
    return Assessment(
        element_ratio=worst_ratio,
        element_index=worst_at,
        element_scale=worst_scale,
        element_error=worst_err,
        rms_error=math.sqrt(sum_o2 / n),
        rms_ref_error=rms_ref,
        rms_bound=max(RMS_RATIO * rms_ref, rms_ulps * eps * rms_t, tiny),
        element_limit=element_ratio,
        rms_ulps=rms_ulps,
        rms_worst_index=max_at,
    )


def _calibrated_verdict(index: int, errors: _Errors) -> Verdict | None:
    a = _assess(errors)
    flat_out, flat64 = errors.out, errors.truth64
    name = f"{_dtype(errors.ref)} reference"
    if a.element_ratio > 1:
        at = a.element_index
        own = f"{a.element_error / a.element_scale:.3g}x" if a.element_scale > 0 else "above"
        return Verdict(
            Outcome.mismatch,
            f"output {index}: error {a.element_error:.3g} is {own} the {name}'s own error against float64 "
            f"(limit {a.element_limit:g}x; worst at flat index {at}: got {_fmt(flat_out[at].item())}, "
            f"expected {_fmt(flat64[at].item())})",
        )
    if a.rms_ratio > 1:
        at = a.rms_worst_index
        own = (
            f"{a.rms_error / a.rms_ref_error:.3g}x the {name}'s own RMS error against float64"
            if a.rms_ref_error > 0
            else f"above the {name}'s (exact) RMS error against float64"
        )
        return Verdict(
            Outcome.mismatch,
            f"output {index}: RMS error {a.rms_error:.3g} is {own} (limit {a.rms_bound:.3g}: "
            f"{RMS_RATIO:g}x, at least {a.rms_ulps:g} ulps of the output's RMS; worst at flat index {at}: "
            f"got {_fmt(flat_out[at].item())}, expected {_fmt(flat64[at].item())})",
        )
    return None
