"""Magnitude binning of float64 ground truth: the per-binade RMS envelope of the reference's error."""

from __future__ import annotations

import sys

import torch

_NBINS = 2048  # magnitude bins: float64's biased exponents

# Bound at import, like the rest of the comparison.
_nonzero = torch.nonzero
_amax = torch.amax

#: Fewest elements behind one magnitude bin's error estimate.
MIN_POOL = 64


_TRASH = 2047  # the bin of elements left out (the reference is not finite there)


#: Block length of ``_first``'s search.
_BLOCK = 4096


def _first(x: torch.Tensor, value: float) -> int:
    """The first index of ``value`` (which occurs) in a contiguous 1-D ``x``, as ``argmax`` gives it for the
    maximum: block maxima first, then within the first block that holds it (``argmax`` is much slower)."""
    whole = x.numel() // _BLOCK * _BLOCK
    if whole:
        hit = _nonzero(_amax(x[:whole].view(-1, _BLOCK), 1) == value)
        if hit.numel():
            block = int(hit[0, 0]) * _BLOCK
            return block + int(_nonzero(x[block : block + _BLOCK] == value)[0, 0])
    return whole + int(_nonzero(x[whole:] == value)[0, 0])


def _truth(r: torch.Tensor, t64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(truth, magnitude bin, finite mask or None when all finite) for one chunk.

    The truth is ref64, or ref where ref64 is not finite. The bin is the biased binary exponent of the
    truth (zeros and subnormals share bin 0); elements where ref is not finite go to the ``_TRASH`` bin.
    Finiteness is read off the exponent bits: ``torch.isfinite`` would allocate several temporaries.
    """
    bins = _exponents(t64)
    good = bins != _TRASH
    t = t64
    if not bool(good.all()):
        t = torch.where(good, t64, r)
        bins = _exponents(t)
    del good
    fin = _exponents(r) != _TRASH
    if bool(fin.all()):
        return t, bins, None
    bins.masked_fill_(~fin, _TRASH)
    return t, bins, fin


def _exponents(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The biased binary exponents (int32) of a contiguous 1-D float64 tensor; 2047 for NaN and inf."""
    words = x.view(torch.int32)
    high = words[1::2] if sys.byteorder == "little" else words[0::2]
    return torch.bitwise_right_shift(high, 20, out=out).bitwise_and_(0x7FF)


def _envelope(counts: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
    """Per-bin RMS reference error, each bin pooled upward to ``MIN_POOL`` elements, non-decreasing."""
    total = float(counts.sum())
    if total == 0:
        return torch.zeros_like(counts)
    need = min(float(MIN_POOL), total)
    pc = torch.cat([torch.zeros(1, dtype=torch.float64), counts.cumsum(0)])
    pq = torch.cat([torch.zeros(1, dtype=torch.float64), sq.cumsum(0)])
    end = torch.searchsorted(pc[1:], pc[:-1] + need - 0.5).clamp(max=counts.numel() - 1)
    pooled_n = pc[end + 1] - pc[:-1]
    rms = torch.where(pooled_n > 0, ((pq[end + 1] - pq[:-1]) / pooled_n.clamp(min=1)).sqrt(), 0.0)
    rms = torch.where(counts > 0, rms, 0.0)
    return torch.cummax(rms, 0).values
