"""How the judge reads a runner's description of an output, and when an output may alias an input."""

from __future__ import annotations

from typing import Any

import torch

from kfoundry.core.evaluation.arena import DTYPES
from kfoundry.core.evaluation.verifier import Verdict
from kfoundry.core.models import Outcome


def check_description(i: int, d: Any, ref: torch.Tensor) -> Verdict | tuple[int, list[int], list[int], str]:
    """The runner's description of output ``i`` checked against the reference's:
    ``(address, shape, stride, device)``, or the Verdict that it fails."""
    if not isinstance(d, list) or not d or d[0] != "tensor" or len(d) != 6:
        kind = d[1] if isinstance(d, list) and len(d) > 1 else "value"
        return Verdict(Outcome.rejected, f"output {i} is a {kind}, not a plain torch.Tensor")
    _, address, dtype, shape, stride, where = d
    if dtype not in DTYPES or not _ints(shape) or not _ints(stride) or not isinstance(address, int):
        return Verdict(Outcome.rejected, f"output {i}: malformed description")
    if list(shape) != list(ref.shape):
        return Verdict(Outcome.wrong_shape, f"output {i} has shape {list(shape)}, expected {list(ref.shape)}")
    if DTYPES[dtype] != ref.dtype:
        return Verdict(
            Outcome.mismatch,
            f"output {i} has dtype {dtype}, expected {str(ref.dtype).removeprefix('torch.')}",
        )
    if ref.numel() and any(st < 0 for st in stride):
        return Verdict(Outcome.rejected, f"output {i} has negative strides")
    return address, list(shape), list(stride), str(where)


def _ints(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def aliases_input(ref: torch.Tensor) -> bool:
    """Whether the reference's own output shares memory with an input (then aliasing is honest)."""
    return bool(getattr(ref, "_kf_aliases_input", False))


def mark_aliasing(refs: list[Any], inputs: list[Any]) -> None:
    storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    for r in refs:
        if isinstance(r, torch.Tensor) and r.numel() and r.untyped_storage().data_ptr() in storages:
            r._kf_aliases_input = True  # type: ignore[attr-defined]
