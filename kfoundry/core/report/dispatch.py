"""Run-time kernel selection of an exported package (copied into it as ``_dispatch.py``).

The package's ``table.json`` lists entries (backend, device, input shapes and dtypes → kernel file and
parameters). A call is checked before anything launches: the active backend, the inputs' device,
their shapes and dtypes must match an entry; then that entry's kernel (built once per entry) runs.
Shapes match an entry exactly, or else fall in the ``input_ranges`` of shape-generic entries (checked
at export against the reference at probe shapes): of those, the one tuned nearest the call's shapes
runs. Anything the table does not cover runs the PyTorch reference instead, with one warning per
kind of miss. Needs torch and kfoundry (for ``kfoundry.runtime.load`` and the problem loader).
"""

from __future__ import annotations

import json
import math
import threading
import warnings
from pathlib import Path
from typing import Any


class DispatchWarning(UserWarning):
    """A call ran the PyTorch reference (no entry covers it) or a kernel tuned on another device."""


def _describe(inputs: tuple[Any, ...]) -> tuple[list[list[int]], list[str], set[str]]:
    import torch

    shapes, dtypes, devices = [], [], set()
    for t in inputs:
        if isinstance(t, torch.Tensor):
            shapes.append(list(t.shape))
            dtypes.append(str(t.dtype).replace("torch.", ""))
            devices.add(t.device.type)
        else:
            shapes.append([])
            dtypes.append(type(t).__name__)
    return shapes, dtypes, devices


class Dispatcher:
    """Chooses and runs the kernel for each call (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        data = json.loads((self.root / "table.json").read_text())
        self.problem: str = data["problem"]
        self.entries: list[dict[str, Any]] = data["entries"]
        self.reference_file = self.root / data["reference"]
        self._models: dict[int, Any] = {}
        self._reference: Any = None
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        #: What the last call ran: ``"kernel:<file>"`` or ``"reference: <why>"``.
        self.last_choice = ""

    # -- selection ---------------------------------------------------------------------------------

    def _backend(self) -> Any:
        from kfoundry.runtime import active_backend

        return active_backend()

    def select(self, *inputs: Any) -> tuple[int | None, str]:
        """The index of the entry that covers this call, or None and why not."""
        shapes, dtypes, devices = _describe(inputs)
        candidates = [i for i, e in enumerate(self.entries) if e["input_shapes"] == shapes]
        candidates = candidates or self.in_range(shapes)
        if not candidates:
            return None, f"no kernel for input shapes {shapes}"
        candidates = [i for i in candidates if e_dtypes(self.entries[i]) == dtypes]
        if not candidates:
            return None, f"no kernel for dtypes {dtypes} at shapes {shapes}"
        try:
            backend = self._backend()
            # the device in use (selecting one again would close the context the kernels were built in)
            device_key = backend.require_device().key if hasattr(backend, "require_device") else ""
        except Exception as exc:  # no device of the backend here
            return None, f"backend unavailable: {type(exc).__name__}: {exc}"
        torch_device = str(getattr(backend, "torch_device", "cpu")).split(":")[0]
        if devices and devices != {torch_device}:
            return (
                None,
                f"inputs on {sorted(devices)}, the {backend.name} kernels take {torch_device} tensors",
            )
        same_backend = [i for i in candidates if self.entries[i]["backend"] == backend.name]
        if not same_backend:
            return None, f"no kernel for backend {backend.name}"
        exact = [i for i in same_backend if self.entries[i]["device"] == device_key]
        if exact:
            return exact[0], ""
        chosen = same_backend[0]
        self._warn_once(
            f"device:{device_key}",
            f"{self.problem}: the kernel for {shapes} was tuned on "
            f"{self.entries[chosen]['device']}, running it on {device_key}",
        )
        return chosen, ""

    def in_range(self, shapes: list[list[int]]) -> list[int]:
        """Shape-generic entries whose ranges hold ``shapes``, the one tuned nearest them first."""
        hits = [i for i, e in enumerate(self.entries) if covers(e.get("input_ranges"), shapes)]
        return sorted(hits, key=lambda i: _distance(self.entries[i]["input_shapes"], shapes))

    # -- running -----------------------------------------------------------------------------------

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, DispatchWarning, stacklevel=4)

    def _problem(self, shapes: dict[str, Any]) -> Any:
        from kfoundry.core.problem import load_problem

        return load_problem(self.reference_file, shapes)

    def _model(self, index: int) -> Any:
        with self._lock:
            if index not in self._models:
                from kfoundry.core.models import Candidate
                from kfoundry.runtime import load

                e = self.entries[index]
                source = (self.root / e["kernel"]).read_text()
                candidate = Candidate(
                    source=source, kind=e["kind"], language=e["language"], params=e["params"]
                )
                self._models[index] = self._problem(e["shapes"]).build_candidate(candidate, load)
            return self._models[index]

    def reference(self) -> Any:
        """The PyTorch reference model (the problem's own constants)."""
        with self._lock:
            if self._reference is None:
                self._reference = self._problem({}).make_reference()
            return self._reference

    def __call__(self, *inputs: Any) -> Any:
        index, why = self.select(*inputs)
        if index is None:
            self._warn_once(f"miss:{why}", f"{self.problem}: {why}; running the PyTorch reference")
            self.last_choice = f"reference: {why}"
            return self.reference()(*inputs)
        self.last_choice = f"kernel:{self.entries[index]['kernel']}"
        return self.run_entry(index, *inputs)

    def run_entry(self, index: int, *inputs: Any) -> Any:
        """Run entry ``index``'s kernel and wait for it: launches are asynchronous, and the outputs are
        ordinary tensors the caller reads at once (a CPU device writes them in place)."""
        from kfoundry.runtime import synchronize

        out = self._model(index)(*inputs)
        synchronize()
        return out


def covers(ranges: list[list[list[int]]] | None, shapes: list[list[int]]) -> bool:
    """Whether every input dimension of ``shapes`` lies in ``ranges`` (per input, per dimension
    ``[lo, hi]``); None (an entry for its own shapes only) covers nothing."""
    if ranges is None or len(ranges) != len(shapes):
        return False
    return all(
        len(r) == len(s) and all(lo <= d <= hi for (lo, hi), d in zip(r, s, strict=True))
        for r, s in zip(ranges, shapes, strict=True)
    )


def _distance(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(
        abs(math.log(max(x, 1) / max(y, 1)))
        for ra, rb in zip(a, b, strict=True)
        for x, y in zip(ra, rb, strict=True)
    )


def e_dtypes(entry: dict[str, Any]) -> list[str]:
    """An entry's input dtypes as ``torch`` spells them without the prefix (``float32``)."""
    return [str(d).replace("torch.", "") for d in entry["input_dtypes"]]
