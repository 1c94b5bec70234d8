"""Native kernel tasks (in the spirit of Kernel Tuner): a kernel with template parameters, a problem
size, argument descriptions and a Python reference function, described in one TOML file::

    name = "vector_add"
    language = "opencl"
    kernel_name = "vector_add"
    kernel_source = "vector_add.cl"          # seed kernel, relative to this file
    reference = "vector_add_ref.py:reference" # function(*inputs) -> output tensor(s)
    [sizes]
    N = 1048576
    [[args]]                                  # kernel arguments, in kernel order
    name = "c"
    kind = "output"                           # input | output | scalar
    shape = ["N"]
    [[args]]
    name = "a"
    kind = "input"
    shape = ["N"]
    [[args]]
    name = "n"
    kind = "scalar"
    dtype = "int32"
    value = "N"
    [[args]]                                  # OpenCL __local scratch, bytes
    name = "scratch"
    kind = "local"
    value = "BLOCK * 4"
    [launch]
    grid = ["ceil_div(N, BLOCK)"]
    block = ["BLOCK"]
    [tune_params]
    BLOCK = [64, 128, 256]

Expressions (shapes, scalar values, launch sizes, restrictions) are Python expressions over the
sizes and template parameters, with ``ceil_div``, ``min`` and ``max``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from kfoundry.core.errors import ProblemError
from kfoundry.core.languages import check_language
from kfoundry.core.models import DEFAULT_LANGUAGE, Language, ParamValue, TunableSpace, stable_hash
from kfoundry.core.size_expr import Expr, evaluate
from kfoundry.runtime import LocalMemory

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class NativeArg(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    #: ``local``: work-group local memory of ``value`` bytes (an expression), an OpenCL ``__local`` pointer.
    kind: Literal["input", "output", "scalar", "local"]
    dtype: str = "float32"
    shape: list[Expr] = Field(default_factory=list)
    #: Scalars: the value (an expression).
    value: Expr | None = None
    #: Inputs: how to draw them (``rand`` uniform [0,1), ``randn``, ``randint`` in [low, high)).
    init: Literal["rand", "randn", "randint"] = "rand"
    low: int = 0
    high: int = 100


class NativeLaunch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grid: list[Expr]
    block: list[Expr] | None = None


class NativeTaskSpec(BaseModel):
    """The TOML file's content."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    #: A registered kernel language (checked when the file is loaded).
    language: Language = DEFAULT_LANGUAGE
    kernel_name: str
    kernel_source: str | None = None
    reference: str
    sizes: dict[str, int | float] = Field(default_factory=dict)
    args: list[NativeArg]
    launch: NativeLaunch
    tune_params: dict[str, list[ParamValue]] = Field(default_factory=dict)
    restrictions: list[str] = Field(default_factory=list)
    defaults: dict[str, ParamValue] = Field(default_factory=dict)
    build_options: list[str] = Field(default_factory=list)


def _dtype(name: str, where: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ProblemError(f"{where}: unknown dtype {name!r}")
    return dt


class NativeReference(nn.Module):
    """The task's reference function as a module."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: Any) -> Any:
        return self.fn(*inputs)


class NativeModel(nn.Module):
    """A native kernel compiled with its parameters and launched as the task describes."""

    def __init__(self, task: NativeTask, source: str, params: dict[str, ParamValue], load: Any) -> None:
        super().__init__()
        self.task = task
        spec = task.spec
        names = {**task.sizes, **params}
        self.kernel = getattr(
            load(source, defines=params, build_options=spec.build_options or None), spec.kernel_name
        )
        self.grid = tuple(int(evaluate(e, names, "launch.grid")) for e in spec.launch.grid)
        self.block = (
            tuple(int(evaluate(e, names, "launch.block")) for e in spec.launch.block)
            if spec.launch.block
            else None
        )
        self.shapes = {a.name: task.shape_of(a) for a in spec.args if a.kind == "output"}
        self.scalars = {
            a.name: evaluate(a.value, names, f"args.{a.name}")
            for a in spec.args
            if a.kind in ("scalar", "local")
        }

    def forward(self, *inputs: Any) -> Any:
        spec = self.task.spec
        feed = iter(inputs)
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), None)
        args: list[Any] = []
        outputs: list[torch.Tensor] = []
        for a in spec.args:
            if a.kind == "input":
                args.append(next(feed))
            elif a.kind == "output":
                out = torch.empty(self.shapes[a.name], dtype=_dtype(a.dtype, a.name), device=device)
                outputs.append(out)
                args.append(out)
            elif a.kind == "local":
                args.append(LocalMemory(int(self.scalars[a.name])))
            else:
                value = self.scalars[a.name]
                args.append(int(value) if a.dtype.startswith("int") else float(value))
        self.kernel(*args, grid=self.grid, block=self.block)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class NativeTask:
    """A loaded native task: spec, sizes in force, seed kernel source and reference function."""

    def __init__(self, path: Path, spec: NativeTaskSpec, sizes: dict[str, int | float]) -> None:
        self.path = path
        self.spec = spec
        self.sizes = sizes
        self.kernel_source = ""
        if spec.kernel_source:
            kpath = path.parent / spec.kernel_source
            if not kpath.is_file():
                raise ProblemError(f"{path}: kernel_source file not found: {kpath}")
            self.kernel_source = _read(kpath, f"{path}: kernel_source")
        file_part, sep, func = spec.reference.partition(":")
        if not sep or not func:
            raise ProblemError(f"{path}: reference must be 'file.py:function', got {spec.reference!r}")
        rpath = path.parent / file_part
        if not rpath.is_file():
            raise ProblemError(f"{path}: reference file not found: {rpath}")
        self.reference_source = _read(rpath, f"{path}: reference")
        namespace: dict[str, Any] = {"__name__": f"kf_reference_{rpath.stem}", "__file__": str(rpath)}
        try:
            exec(compile(self.reference_source, str(rpath), "exec", dont_inherit=True), namespace)
        except SyntaxError as exc:
            raise ProblemError(f"{rpath}:{exc.lineno}: syntax error: {exc.msg}") from None
        except (Exception, SystemExit) as exc:  # a reference module that exits is an error too
            raise ProblemError(
                one_line(f"{rpath}: error while loading: {type(exc).__name__}: {exc}")
            ) from None
        self.reference_fn = namespace.get(func)
        if not callable(self.reference_fn):
            raise ProblemError(f"{rpath}: no function {func!r}")
        if not any(a.kind == "output" for a in spec.args):
            raise ProblemError(f"{path}: no argument of kind 'output'")
        for a in spec.args:
            _dtype(a.dtype, f"{path}: args.{a.name}")
            if a.kind in ("scalar", "local") and a.value is None:
                raise ProblemError(f"{path}: {a.kind} argument {a.name!r} has no value")
            if a.kind in ("input", "output"):
                shape = self.shape_of(a)
                if any(d < 0 for d in shape):
                    raise ProblemError(f"{path}: args.{a.name}.shape {shape} has a negative size")
            if a.kind == "input" and a.init == "randint" and a.low >= a.high:
                raise ProblemError(f"{path}: args.{a.name}: randint needs low < high (got {a.low}, {a.high})")

    def nbytes(self) -> int:
        """Bytes of all input and output arguments at the sizes in force (nothing is allocated)."""
        total = 0
        for a in self.spec.args:
            if a.kind in ("input", "output"):
                total += math.prod(self.shape_of(a)) * _dtype(a.dtype, a.name).itemsize
        return total

    @property
    def space(self) -> TunableSpace:
        return TunableSpace(params=dict(self.spec.tune_params), restrictions=list(self.spec.restrictions))

    def fingerprint(self) -> str:
        return stable_hash(self.spec.model_dump(mode="json"), self.reference_source)

    def shape_of(self, arg: NativeArg) -> list[int]:
        where = f"{self.path}: args.{arg.name}.shape"
        dims = [evaluate(e, self.sizes, where) for e in arg.shape]
        if not all(isinstance(d, int | float) and math.isfinite(d) and float(d).is_integer() for d in dims):
            raise ProblemError(one_line(f"{where}: sizes must be whole numbers, got {dims}"))
        return [int(d) for d in dims]

    def make_inputs(self, seed: int, device: torch.device | str | None = None) -> list[torch.Tensor]:
        """The input arguments drawn with ``seed``, on ``device`` (default: the host)."""
        device = torch.device(device or "cpu")
        gen = torch.Generator(device=device).manual_seed(seed)
        out: list[torch.Tensor] = []
        for a in self.spec.args:
            if a.kind != "input":
                continue
            shape, dtype = self.shape_of(a), _dtype(a.dtype, a.name)
            if a.init == "randint" or not dtype.is_floating_point:
                out.append(torch.randint(a.low, a.high, shape, generator=gen, dtype=dtype, device=device))
            elif a.init == "randn":
                out.append(torch.randn(shape, generator=gen, dtype=dtype, device=device))
            else:
                out.append(torch.rand(shape, generator=gen, dtype=dtype, device=device))
        return out

    def meta_inputs(self) -> list[torch.Tensor]:
        """The input arguments as empty tensors on the meta device (shapes and dtypes, no memory)."""
        return [
            torch.empty(self.shape_of(a), dtype=_dtype(a.dtype, a.name), device="meta")
            for a in self.spec.args
            if a.kind == "input"
        ]

    def make_reference(self) -> nn.Module:
        return NativeReference(self.reference_fn)

    def make_model(self, source: str, params: dict[str, ParamValue], load: Any) -> nn.Module:
        return NativeModel(self, source, params, load)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


#: Task, kernel and reference files larger than this are refused before they are read.
MAX_FILE_BYTES = 16 * 2**20


def _read(path: Path, what: str) -> str:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ProblemError(f"{what}: {path} is larger than {MAX_FILE_BYTES >> 20} MiB")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(one_line(f"{what}: cannot read {path}: {exc}")) from None


def load_native_task(path: Path, shapes: dict[str, int | float]) -> NativeTask:
    """Parse and check a native task file; ``shapes`` override its ``[sizes]``."""
    text = _read(path, "cannot read problem")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProblemError(one_line(f"{path}: {exc}")) from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise ProblemError(f"{path}: unreadable TOML ({type(exc).__name__})") from None
    try:
        spec = NativeTaskSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ProblemError(one_line(f"{path}: {loc}: {err['msg']}")) from None
    check_language(spec.language, f"{path}: language")
    sizes = dict(spec.sizes)
    for name, value in shapes.items():
        if name not in sizes:
            raise ProblemError(f"{path}: unknown size {name!r} (known: {', '.join(sorted(sizes)) or 'none'})")
        sizes[name] = value
    for name, value in sizes.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ProblemError(f"{path}: size {name!r} is not a finite number")
    return NativeTask(path, spec, sizes)
