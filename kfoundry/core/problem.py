"""Problems: KernelBench-format Python files and native kernel tasks (TOML), behind one interface.

``load_problem(path, shapes)`` returns a :class:`Problem`. A KernelBench file defines ``Model``,
``get_inputs()`` and (optionally) ``get_init_inputs()``; its module-level numeric constants are the
*shapes* and may be overridden (``--shape batch_size=8``). A native task is a ``.toml`` file (see
:mod:`kfoundry.core.native_task`). Either way a problem builds its reference model, its inputs for a
seed, and a runnable model from a :class:`~kfoundry.core.models.Candidate`, and knows the least it
must move (``bytes_moved``) and compute (``flops``, torch's FLOP counter on the reference).

An override rewrites the constant's ``NAME = value`` line(s) and runs the module again, so constants
derived from it follow (:mod:`kfoundry.core.kernelbench_file` reads the file). :meth:`Problem.check_size` sizes one call's inputs and outputs
from shapes and dtypes (on the meta device: nothing allocated) against ``problem.max_bytes``, the
device's and the host's memory. Every malformed file is one :class:`ProblemError` line.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from kfoundry.core.errors import CandidateError, ProblemError
from kfoundry.core.generator import ProblemSummary
from kfoundry.core.kernelbench_file import load_kernelbench_module, module_constants
from kfoundry.core.models import Candidate, ParamValue, TunableSpace, stable_hash
from kfoundry.core.native_task import one_line

Loader = Callable[..., Any]


class CandidateBuildError(CandidateError):
    """A candidate's Python source could not be executed or defines no usable ``ModelNew``."""


def as_tensor_list(value: Any) -> list[Any]:
    """A model's output (tensor, tuple or list) as a flat list."""
    if isinstance(value, (tuple, list)):
        return list(value)
    return [value]


@dataclass
class Analysis:
    """What one reference run tells about a problem."""

    input_shapes: list[list[int]]
    input_dtypes: list[str]
    output_shapes: list[list[int]]
    output_dtypes: list[str]
    bytes_moved: int
    flops: float


@dataclass
class Problem:
    """A loaded problem (see module docstring). Build with :func:`load_problem`."""

    name: str
    path: Path
    format: Literal["kernelbench", "native"]
    source: str
    shapes: dict[str, int | float]
    module: types.ModuleType | None = None
    native: Any = None  # kfoundry.core.native_task.NativeTask for native problems
    _analysis: Analysis | None = field(default=None, repr=False)

    # -- identity ---------------------------------------------------------------------------------

    @property
    def key(self) -> str:
        """Content hash of what defines the problem (source, format, shapes in force)."""
        extra = self.native.fingerprint() if self.native is not None else ""
        return stable_hash(self.format, self.source, self.shapes, extra)

    @property
    def space(self) -> TunableSpace | None:
        """The native task's tunable parameters (None for KernelBench problems)."""
        return self.native.space if self.native is not None else None

    @property
    def language(self) -> str | None:
        return self.native.spec.language if self.native is not None else None

    # -- building ---------------------------------------------------------------------------------

    def make_init_inputs(self) -> list[Any]:
        """Constructor arguments of ``Model`` / ``ModelNew`` (seeded: deterministic)."""
        if self.native is not None:
            return []
        fn = getattr(self.module, "get_init_inputs", None)
        if fn is None:
            return []
        torch.manual_seed(0)
        return list(fn())

    def make_inputs(self, seed: int, device: torch.device | str | None = None) -> list[Any]:
        """Forward arguments drawn with ``seed`` (fresh random tensors, as the problem defines them).

        With ``device``, tensors are drawn there (``get_inputs`` runs under ``torch.device``): a GPU
        fills a KernelBench Level-1 input in milliseconds where the host takes seconds. The same seed
        gives different values on different devices (each has its own generator).
        """
        if self.native is not None:
            return self.native.make_inputs(seed, device)
        torch.manual_seed(seed)
        on_host = device is None or torch.device(device).type == "cpu"  # the default: no device mode needed
        with contextlib.nullcontext() if on_host or device is None else torch.device(device):
            inputs = self.module.get_inputs()  # type: ignore[union-attr]
        if not isinstance(inputs, (list, tuple)):
            raise ProblemError(f"{self.path}: get_inputs() must return a list, got {type(inputs).__name__}")
        if device is None:
            return list(inputs)
        return [v.to(device) if isinstance(v, torch.Tensor) else v for v in inputs]

    def make_reference(self, seed: int = 0) -> nn.Module:
        """The reference model, built after seeding the RNG with ``seed`` (KernelBench convention)."""
        if self.native is not None:
            return self.native.make_reference()
        torch.manual_seed(seed)
        return self.module.Model(*self.make_init_inputs())  # type: ignore[union-attr]

    def candidate_params(self, candidate: Candidate) -> dict[str, ParamValue]:
        """Parameter values in force: the first allowed value of each tunable, then the candidate's own."""
        params: dict[str, ParamValue] = {}
        for space in (self.space, candidate.space):
            if space is not None:
                params.update({k: v[0] for k, v in space.params.items() if v})
        if self.native is not None:
            params.update(self.native.spec.defaults)
        params.update(candidate.params)
        return params

    def build_candidate(self, candidate: Candidate, load: Loader, seed: int = 0) -> nn.Module:
        """A runnable model for ``candidate``; ``load`` compiles kernel source (``kfoundry.runtime.load``).

        KernelBench: the source runs as a fresh module with ``PARAMS`` (the parameter values) set, and
        ``ModelNew`` is built after seeding the RNG with ``seed``. Native: the kernel source is compiled
        with the parameters as defines and launched as the task describes.
        """
        params = self.candidate_params(candidate)
        if self.native is not None or candidate.kind == "native":
            if self.native is None:
                raise CandidateBuildError(
                    f"problem {self.name} is a KernelBench problem; candidate is a native kernel"
                )
            return self.native.make_model(candidate.source, params, load)
        module = types.ModuleType("kf_candidate")
        module.PARAMS = dict(params)  # type: ignore[attr-defined]
        try:  # dont_inherit: this file's ``from __future__ import annotations`` is not the candidate's
            code = compile(candidate.source, "<candidate>", "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise CandidateBuildError(f"candidate line {exc.lineno}: syntax error: {exc.msg}") from None
        # registered so that what looks a class's module up (dataclasses, pickle, typing) finds it
        sys.modules[module.__name__] = module
        # and its text, for inspect.getsource (Triton's @triton.jit reads its kernels' source)
        lines = candidate.source.splitlines(True)
        linecache.cache["<candidate>"] = (len(candidate.source), None, lines, "<candidate>")
        exec(code, module.__dict__)
        namespace = module.__dict__
        cls = namespace.get("ModelNew")
        if not isinstance(cls, type) or not issubclass(cls, nn.Module):
            raise CandidateBuildError("candidate defines no ModelNew(nn.Module) class")
        torch.manual_seed(seed)
        return cls(*self.make_init_inputs())

    # -- analysis ---------------------------------------------------------------------------------

    def input_bytes(self) -> int | None:
        """Bytes of one call's inputs from their shapes and dtypes, drawn on the meta device (nothing is
        allocated); None where ``get_inputs`` cannot run there."""
        if self.native is not None:
            return self.native.nbytes()
        try:
            with torch.device("meta"):
                inputs = self.make_inputs(0)
        except (Exception, SystemExit):
            return None
        return sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))

    def check_size(self, max_bytes: int, device_bytes: int | None = None) -> None:
        """Refuse (one line) a problem whose inputs and outputs of one call exceed ``max_bytes``, the
        device's memory or the host's: computed from shapes and dtypes before anything is allocated."""
        limits = [(max_bytes, "the limit problem.max_bytes")]
        if device_bytes:
            limits.append((device_bytes, "the device's memory"))
        host = _host_memory()
        if host:
            limits.append((host, "this machine's memory"))
        limit, what = min(limits)
        shapes = ", ".join(f"{k}={v}" for k, v in self.shapes.items())
        known = self.native.nbytes() if self.native is not None else self.input_bytes()
        if known is not None and known > limit:
            raise ProblemError(
                f"{self.path}: one call's {'arguments' if self.native else 'inputs'} take {_size(known)} "
                f"({shapes}), more than {what} ({_size(limit)})"
            )
        if known is None or self.native is not None:
            return  # native: ``known`` counts every argument; else get_inputs does not run on meta
        total = self.analysis(max_input_bytes=limit).bytes_moved
        if total > limit:
            raise ProblemError(
                f"{self.path}: one call's inputs and outputs take {_size(total)} ({shapes}), "
                f"more than {what} ({_size(limit)})"
            )

    def analysis(self, max_input_bytes: int | None = None) -> Analysis:
        """Run the reference once (seed 0): shapes, dtypes, bytes moved and FLOPs (cached).

        On the meta device first (nothing allocated); where the reference cannot run there, for real,
        but only when the inputs (sized on the meta device) fit ``max_input_bytes`` (without one: a
        quarter of this machine's memory).
        """
        if self._analysis is None:
            try:  # on the meta device: shapes and FLOPs without allocating or computing anything
                with torch.device("meta"):
                    inputs, outputs, flops = self._run_counted(meta=True)
            except (Exception, SystemExit):
                known = self.input_bytes()
                host = _host_memory()
                limit = max_input_bytes if max_input_bytes is not None else (host // 4 if host else None)
                if limit is not None and (
                    (known is None and max_input_bytes is not None) or (known is not None and known > limit)
                ):
                    raise ProblemError(
                        f"{self.path}: the reference does not run on the meta device, and its inputs"
                        f" ({'unknown size' if known is None else _size(known)}) are not drawn for real"
                        f" beyond {_size(limit)}"
                    ) from None
                try:
                    inputs, outputs, flops = self._run_counted()
                except (Exception, SystemExit) as exc:
                    raise ProblemError(
                        one_line(
                            f"{self.path}: the reference failed at {_shape_text(self.shapes)}: "
                            f"{type(exc).__name__}: {exc}"
                        )
                    ) from None
            tensors_in = [t for t in inputs if isinstance(t, torch.Tensor)]
            tensors_out = [t for t in outputs if isinstance(t, torch.Tensor)]
            self._analysis = Analysis(
                input_shapes=[list(t.shape) for t in tensors_in],
                input_dtypes=[str(t.dtype).removeprefix("torch.") for t in tensors_in],
                output_shapes=[list(t.shape) for t in tensors_out],
                output_dtypes=[str(t.dtype).removeprefix("torch.") for t in tensors_out],
                bytes_moved=sum(t.numel() * t.element_size() for t in tensors_in + tensors_out),
                flops=flops,
            )
        return self._analysis

    def _run_counted(self, meta: bool = False) -> tuple[list[Any], list[Any], float]:
        from torch.utils.flop_counter import FlopCounterMode

        # a native task draws with a host generator: on the meta device its inputs are made empty
        inputs = self.native.meta_inputs() if meta and self.native is not None else self.make_inputs(0)
        model = self.make_reference()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            outputs = as_tensor_list(model(*inputs))
        return inputs, outputs, float(counter.get_total_flops())

    @property
    def bytes_moved(self) -> int:
        """Bytes of all inputs and outputs: the least any kernel must move."""
        return self.analysis().bytes_moved

    @property
    def flops(self) -> float:
        """FLOPs of the reference by torch's FLOP counter (0 where it counts none, e.g. elementwise)."""
        return self.analysis().flops

    def summary(self) -> ProblemSummary:
        """What a generator needs to know about this problem."""
        a = self.analysis()
        return ProblemSummary(
            name=self.name,
            format=self.format,
            reference_source=self.native.reference_source if self.native is not None else self.source,
            shapes=dict(self.shapes),
            input_shapes=a.input_shapes,
            input_dtypes=a.input_dtypes,
            output_shapes=a.output_shapes,
            bytes_moved=a.bytes_moved,
            flops=a.flops,
            path=str(self.path),
        )


def _load_kernelbench(path: Path, shapes: dict[str, int | float]) -> Problem:
    source, module = load_kernelbench_module(path, shapes)
    return Problem(
        name=path.stem,
        path=path,
        format="kernelbench",
        source=source,
        shapes=module_constants(module),
        module=module,
    )


def _shape_text(shapes: dict[str, int | float]) -> str:
    return ", ".join(f"{k}={v}" for k, v in shapes.items()) or "its own shapes"


def _size(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _host_memory() -> int | None:
    """Physical memory of this machine in bytes (None where unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def load_problem(path: str | Path, shapes: dict[str, int | float] | None = None) -> Problem:
    """Load a KernelBench ``.py`` problem or a native ``.toml`` task, with shape overrides.

    Raises :class:`ProblemError` (one line) for a missing file, a syntax error, no ``Model``,
    no ``get_inputs``, an unknown shape constant or a malformed native task.
    """
    p = Path(path)
    if not p.is_file():
        raise ProblemError(f"problem file not found: {p}")
    if p.suffix == ".toml":
        from kfoundry.core.native_task import load_native_task

        task = load_native_task(p, shapes or {})
        return Problem(
            name=task.spec.name or p.stem,
            path=p,
            format="native",
            source=task.kernel_source,
            shapes=dict(task.sizes),
            native=task,
        )
    if p.suffix != ".py":
        raise ProblemError(f"{p}: a problem is a KernelBench .py file or a native task .toml file")
    return _load_kernelbench(p, dict(shapes or {}))


def parse_shape_overrides(items: list[str] | tuple[str, ...]) -> dict[str, int | float]:
    """``["batch_size=8", "eps=1e-5"]`` -> ``{"batch_size": 8, "eps": 1e-05}``."""
    out: dict[str, int | float] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise ProblemError(f"--shape {item!r}: expected NAME=VALUE")
        try:
            out[name.strip()] = int(raw)
        except ValueError:
            try:
                out[name.strip()] = float(raw)
            except ValueError:
                raise ProblemError(f"--shape {item!r}: value is not a number") from None
        value = out[name.strip()]
        if isinstance(value, float) and not math.isfinite(value):
            raise ProblemError(f"--shape {item!r}: value is not a finite number")
    return out
