"""The runtime guard around a candidate's ``forward``: a torch dispatch mode that

- records every torch operator the candidate runs and flags those that compute (a torch fallback,
  however reached: directly, in a try/except, through inheritance or a helper), and
- poisons freshly allocated tensors (NaN for floats, a sentinel for integers) so that an output
  element the kernel never writes cannot pass, nor can reused memory from the reference's freed
  output, and
- records every thread the candidate starts: work handed to a thread can finish after the clock
  stops, so a forward that starts one is rejected.
"""

from __future__ import annotations

import _thread
import sys
import threading
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: Operators a forward may run: allocation, views, copies and shape bookkeeping.
ALLOWED_OPS = {
    "empty",
    "empty_like",
    "new_empty",
    "empty_strided",
    "new_empty_strided",
    "zeros",
    "zeros_like",
    "new_zeros",
    "ones",
    "ones_like",
    "new_ones",
    "full",
    "full_like",
    "new_full",
    "fill_",
    "zero_",
    "view",
    "_unsafe_view",
    "reshape",
    "_reshape_alias",
    "detach",
    "alias",
    "t",
    "transpose",
    "permute",
    "expand",
    "contiguous",
    "clone",
    "copy_",
    "_to_copy",
    "as_strided",
    "squeeze",
    "unsqueeze",
    "flatten",
    "unflatten",
    "select",
    "slice",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "narrow",
    "lift_fresh",
    "lift_fresh_copy",
    "view_as",
    "expand_as",
    "resize_",
    "arange",
    "scalar_tensor",
    "_local_scalar_dense",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_same_size",
    "_has_compatible_shallow_copy_type",
    "set_",
}

_FRESH = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"}

INT_POISON = -0x5A5A5A5A


def poison(t: torch.Tensor) -> None:
    """Fill ``t`` with a value no correct kernel leaves behind (NaN for floating types)."""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        info = torch.iinfo(t.dtype)
        t.fill_(max(info.min, min(info.max, INT_POISON)) if info.min < 0 else info.max)


#: Torch functions that read metadata or make tensors (never compute), beside :data:`ALLOWED_OPS`.
METADATA_FUNCTIONS = {
    "size",
    "stride",
    "numel",
    "dim",
    "data_ptr",
    "element_size",
    "is_contiguous",
    "storage_offset",
    "get_device",
    "is_floating_point",
    "is_complex",
    "is_tensor",
    "is_storage",
    "result_type",
    "can_cast",
    "promote_types",
    "tensor",
    "as_tensor",
    "item",
    "is_same_size",
}
#: Ways a forward hands a tensor's memory to host code (NumPy computes there, unseen by either mode).
HOST_VIEWS = {"numpy", "array", "dlpack", "tolist"}
_NAMESPACES = ("_VariableFunctions", "_nn", "_special", "_linalg", "_fft")


def _computing_function(name: str) -> str | None:
    """The torch function a ``__torch_function__`` name stands for, if it computes (``matmul``, ``__add__``)."""
    base = name.split(".")[0].strip("_")
    if base in HOST_VIEWS:
        return f"{base} (the tensor's memory handed to the host)"
    if not base or base in ALLOWED_OPS or base in METADATA_FUNCTIONS:
        return None
    for candidate in (base, base[1:] if base[:1] in ("r", "i") else None):
        if (
            candidate
            and candidate not in ALLOWED_OPS
            and candidate not in METADATA_FUNCTIONS
            and any(hasattr(getattr(torch._C, ns, None), candidate) for ns in _NAMESPACES)
        ):
            return candidate
    return None


#: Code of the harness's kernel-launch wrappers: a host view taken inside one is the backend's own
#: launch (a language whose kernels run on the host, a copy-in/copy-out runtime), not the forward's.
LAUNCH_CODES: set[Any] = set()


def _in_launch() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in LAUNCH_CODES:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class _FunctionWatch(TorchFunctionMode):
    """A second, independent record of torch compute: torch functions as Python calls them.

    Popping the dispatch modes (``_disable_current_modes``) or calling an operator at a chosen dispatch
    key gets past :class:`ForwardGuard`'s dispatch mode; it does not get past this one.
    """

    def __init__(self, forbidden: list[str]) -> None:
        super().__init__()
        self.forbidden = forbidden

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = _computing_function(str(getattr(func, "__name__", "")))
        if name is not None and name.endswith("handed to the host)") and _in_launch():
            name = None
        if name is not None and name not in self.forbidden:
            self.forbidden.append(name)
        return func(*args, **(kwargs or {}))


class ForwardGuard(TorchDispatchMode):
    """Use as ``with ForwardGuard(poison=True) as g: model(*inputs)``; then read ``g.forbidden``."""

    def __init__(self, poison_fresh: bool = True) -> None:
        super().__init__()
        self.poison_fresh = poison_fresh
        self.forbidden: list[str] = []
        self.threads: list[str] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> ForwardGuard:
        def record(original: Any) -> Any:
            def started(function: Any, *args: Any, **kwargs: Any) -> Any:
                thread = getattr(function, "__self__", None)  # threading.Thread.start passes its _bootstrap
                self.threads.append(
                    str(getattr(thread, "name", None) or getattr(function, "__name__", "a thread"))
                )
                return original(function, *args, **kwargs)

            return started

        # threading.Thread.start goes through threading._start_new_thread (3.13: _start_joinable_thread)
        routes = (
            (threading, "_start_new_thread"),
            (threading, "_start_joinable_thread"),
            (_thread, "start_new_thread"),
        )
        for owner, name in routes:
            original = getattr(owner, name, None)
            if original is not None:
                self._saved.append((owner, name, original))
                setattr(owner, name, record(original))
        self._functions = _FunctionWatch(self.forbidden)
        self._functions.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._functions.__exit__(*exc)
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name not in ALLOWED_OPS and name not in self.forbidden:
            self.forbidden.append(name)
        out = func(*args, **(kwargs or {}))
        if self.poison_fresh and name in _FRESH and isinstance(out, torch.Tensor):
            poison(out)
        return out
