"""Parameter spaces: ordered allowed values, restrictions, and device limits applied before compiling.

A :class:`ParamSpace` holds ``name -> ordered values``, restrictions (Python expressions over the
parameter names, constants and ``device``, or callables taking the configuration), and optional
device limits (work-group size, per-dimension sizes, local/shared memory) that prune configurations
before anything is compiled. Every valid configuration can be enumerated, encoded as a point in the
unit cube (ordinal index per parameter) and looked up by key.
"""

from __future__ import annotations

import builtins
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from kfoundry.core.errors import KfError
from kfoundry.core.models import DeviceProfile, ParamValue, TunableSpace

Config = dict[str, ParamValue]
ConfigKey = tuple[ParamValue, ...]
Restriction = str | Callable[[Mapping[str, Any]], bool]

#: Builtins a restriction expression may use.
SAFE_BUILTINS: dict[str, Any] = {
    name: getattr(builtins, name)
    for name in ("abs", "min", "max", "int", "float", "round", "len", "all", "any", "sum", "bool", "pow")
}
SAFE_BUILTINS.update({"math": math, "True": True, "False": False, "None": None})

#: Largest cross product a space enumerates (narrow the values or add restrictions beyond it).
MAX_PRODUCT = 5_000_000

_BLOCK_NAME = re.compile(
    r"^(block_size|block_dim|block|blk|wg_size|wg|work_group_size|workgroup|local_size|local|"
    r"threads|num_threads|threads_per_block|tb)(?:_?([xyz]))?$",
    re.IGNORECASE,
)


class SpaceError(KfError):
    """A parameter space is malformed (bad values, bad restriction, nothing valid)."""


def detect_block_params(names: Sequence[str]) -> tuple[str, ...]:
    """Parameter names that set the work-group (thread-block) shape, ordered x, y, z."""
    found: dict[str, str] = {}
    for name in names:
        match = _BLOCK_NAME.match(name)
        if match:
            axis = (match.group(2) or "x").lower()
            found.setdefault(axis, name)
    return tuple(found[axis] for axis in "xyz" if axis in found)


#: Device fields a restriction may name directly (``BLOCK_X * BLOCK_Y <= max_work_group_size``).
DEVICE_NAMES = frozenset(DeviceProfile.model_fields) | {"device"}


class _Expr:
    """A compiled restriction expression; unknown names are rejected when the space is built."""

    def __init__(self, text: str, known: set[str]) -> None:
        self.text = text
        try:
            self.code = compile(text, "<restriction>", "eval")
        except SyntaxError as exc:
            raise SpaceError(f"restriction {text!r}: syntax error: {exc.msg}") from None
        unknown = sorted(set(self.code.co_names) - known - set(SAFE_BUILTINS) - DEVICE_NAMES)
        if unknown:
            raise SpaceError(f"restriction {text!r}: unknown name(s) {', '.join(unknown)}")
        #: Names a device field (or ``device``): only checked when the space has a device.
        self.needs_device = bool(set(self.code.co_names) & DEVICE_NAMES - known)

    def __call__(self, scope: dict[str, Any]) -> Any:
        return eval(self.code, {"__builtins__": SAFE_BUILTINS}, scope)  # noqa: S307 (names checked above)


class ParamSpace:
    """Template parameters with their allowed values, restrictions and device limits."""

    def __init__(
        self,
        params: Mapping[str, Sequence[ParamValue]],
        restrictions: Sequence[Restriction] = (),
        *,
        constants: Mapping[str, Any] | None = None,
        device: DeviceProfile | None = None,
        block: Sequence[str] | None = None,
        local_mem_expr: str | None = None,
        members: Iterable[Sequence[ParamValue]] | None = None,
    ) -> None:
        if not params:
            raise SpaceError("a parameter space needs at least one parameter")
        self.params: dict[str, list[ParamValue]] = {}
        for name, values in params.items():
            if not name.isidentifier():
                raise SpaceError(f"parameter name {name!r} is not an identifier")
            vals = list(values)
            if not vals:
                raise SpaceError(f"parameter {name!r} has no values")
            if len({repr(v) for v in vals}) != len(vals):
                raise SpaceError(f"parameter {name!r} lists a value twice: {vals}")
            self.params[name] = vals
        self.names: list[str] = list(self.params)
        self.constants: dict[str, Any] = dict(constants or {})
        self.device = device
        self._base_scope: dict[str, Any] = {**(dict(device) if device is not None else {}), **self.constants}
        self._base_scope["device"] = device
        #: Work-group (thread-block) sizes per dimension, as expressions; by default the parameters
        #: whose names say so (``BLOCK_SIZE_X``, ``block_size_y``, ``WG_X``, ``LOCAL_SIZE``, ...).
        self.block = tuple(block) if block is not None else detect_block_params(self.names)
        known = set(self.names) | set(self.constants)
        self._block = [_Expr(str(b), known) for b in self.block]
        self.restrictions: list[Restriction] = list(restrictions)
        self._checks: list[tuple[str, Callable[[dict[str, Any]], Any]]] = []
        for r in self.restrictions:
            if isinstance(r, str):
                expr = _Expr(r, known)
                if not expr.needs_device or device is not None:
                    self._checks.append((r, expr))
            elif callable(r):
                fn = r
                self._checks.append((getattr(fn, "__name__", "restriction"), fn))
            else:
                raise SpaceError(f"a restriction must be an expression or a callable, got {r!r}")
        self.local_mem_expr = local_mem_expr
        self._local_mem = _Expr(local_mem_expr, known) if local_mem_expr else None
        self._index = {name: {repr(v): i for i, v in enumerate(vals)} for name, vals in self.params.items()}
        #: When set, only these configurations exist (a recorded space); restrictions still apply.
        self.members: list[ConfigKey] | None = None
        if members is not None:
            self.members = sorted({tuple(m) for m in members}, key=lambda k: self.indices(self.config(k)))

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_tunable(
        cls, tunable: TunableSpace, device: DeviceProfile | None = None, **kwargs: Any
    ) -> ParamSpace:
        """The space a candidate declares, with the device's limits applied."""
        return cls(tunable.params, tunable.restrictions, device=device, **kwargs)

    def for_device(self, device: DeviceProfile) -> ParamSpace:
        """The same space with ``device``'s limits applied."""
        return ParamSpace(
            self.params,
            self.restrictions,
            constants=self.constants,
            device=device,
            block=self.block,
            local_mem_expr=self.local_mem_expr,
            members=self.members,
        )

    # -- validity -------------------------------------------------------------------------------

    def key(self, config: Mapping[str, Any]) -> ConfigKey:
        """The configuration as a tuple in parameter order (hashable)."""
        return tuple(config[name] for name in self.names)

    def config(self, key: Sequence[ParamValue]) -> Config:
        return dict(zip(self.names, key, strict=True))

    def device_violation(self, config: Mapping[str, Any]) -> str | None:
        """Why ``config`` exceeds the device's limits, or None."""
        dev = self.device
        if dev is None:
            return None
        scope = self._scope(config)
        dims = [int(b(scope)) for b in self._block]
        if dims and dev.max_work_group_size and math.prod(dims) > dev.max_work_group_size:
            return f"work-group size {math.prod(dims)} > device maximum {dev.max_work_group_size}"
        for axis, (size, limit) in enumerate(zip(dims, dev.max_work_item_sizes or [], strict=False)):
            if size > limit:
                return f"work-group dimension {axis} size {size} > device maximum {limit}"
        mem_limit = dev.local_mem_bytes or dev.shared_mem_per_block
        if self._local_mem is not None and mem_limit:
            need = self._local_mem(scope)
            if need > mem_limit:
                return f"local memory {need} bytes > device maximum {mem_limit}"
        return None

    def _scope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {**self._base_scope, **config}

    def violation(self, config: Mapping[str, Any]) -> str | None:
        """Why ``config`` is not in the space (unknown value, restriction, device limit), or None."""
        for name in self.names:
            if name not in config:
                return f"parameter {name} missing"
            if repr(config[name]) not in self._index[name]:
                return f"{name}={config[name]!r} is not an allowed value"
        extra = set(config) - set(self.names)
        if extra:
            return f"unknown parameter(s) {', '.join(sorted(extra))}"
        if self.members is not None and self.key(config) not in self._member_set:
            return "configuration is not in the recorded space"
        scope = self._scope(config)
        for text, check in self._checks:
            try:
                ok = check(scope)
            except Exception as exc:
                return f"restriction {text!r} failed: {type(exc).__name__}: {exc}"
            if not ok:
                return f"restriction {text!r} is false"
        try:
            return self.device_violation(config)
        except Exception as exc:
            return f"device limit check failed: {type(exc).__name__}: {exc}"

    @cached_property
    def _member_set(self) -> set[ConfigKey]:
        return set(self.members or ())

    def is_valid(self, config: Mapping[str, Any]) -> bool:
        return self.violation(config) is None

    # -- enumeration and encoding ---------------------------------------------------------------

    @property
    def product_size(self) -> int:
        return math.prod(len(v) for v in self.params.values())

    @cached_property
    def keys(self) -> list[ConfigKey]:
        """Every valid configuration's key, in cross-product order."""
        if self.members is not None:
            candidates: Iterable[ConfigKey] = self.members
        elif self.product_size > MAX_PRODUCT:
            raise SpaceError(
                f"space has {self.product_size} combinations (over {MAX_PRODUCT}); narrow the values"
            )
        else:
            candidates = itertools.product(*self.params.values())
        out = [k for k in candidates if self.violation(self.config(k)) is None]
        if not out:
            raise SpaceError("no configuration satisfies the restrictions and device limits")
        return out

    def configs(self) -> Iterator[Config]:
        return (self.config(k) for k in self.keys)

    @property
    def size(self) -> int:
        """Number of valid configurations."""
        return len(self.keys)

    def indices(self, config: Mapping[str, Any]) -> list[int]:
        """The ordinal index of each parameter's value."""
        return [self._index[name][repr(config[name])] for name in self.names]

    def encode(self, config: Mapping[str, Any]) -> np.ndarray:
        """A point in [0, 1]^d: each parameter's ordinal index scaled by its number of values."""
        return np.array(
            [
                i / max(len(self.params[n]) - 1, 1)
                for n, i in zip(self.names, self.indices(config), strict=True)
            ],
            dtype=float,
        )

    @cached_property
    def encoded(self) -> np.ndarray:
        """Every valid configuration encoded (rows follow :attr:`keys`)."""
        return np.array([self.encode(self.config(k)) for k in self.keys], dtype=float).reshape(
            len(self.keys), -1
        )

    @cached_property
    def position(self) -> dict[ConfigKey, int]:
        """Row of each valid key in :attr:`keys`."""
        return {k: i for i, k in enumerate(self.keys)}

    def neighbours(self, config: Mapping[str, Any]) -> list[Config]:
        """Valid configurations one step away in one parameter's ordered values."""
        out: list[Config] = []
        for name, idx in zip(self.names, self.indices(config), strict=True):
            for step in (-1, 1):
                j = idx + step
                if 0 <= j < len(self.params[name]):
                    other = {**config, name: self.params[name][j]}
                    if self.is_valid(other):
                        out.append(other)
        return out

    def describe(self) -> str:
        return f"{len(self.names)} parameters, {self.product_size} combinations, {self.size} valid"
