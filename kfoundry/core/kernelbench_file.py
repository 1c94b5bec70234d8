"""Reading a KernelBench-format problem file: parsed with bounds, run as a module, shapes overridden.

A KernelBench file defines ``Model``, ``get_inputs()`` and (optionally) ``get_init_inputs()``; its
module-level numeric constants are the *shapes*. An override rewrites the constant's
``NAME = value`` line(s) and runs the module again, so constants derived from it follow
(``bias_shape = (out_channels, 1, 1)``); one that cannot be applied soundly is refused naming the
constant and why. Every malformed file is one :class:`ProblemError` line.
"""

from __future__ import annotations

import ast
import math
import types
from pathlib import Path

from torch import nn

from kfoundry.core.errors import ProblemError
from kfoundry.core.native_task import MAX_FILE_BYTES, one_line

__all__ = ["MAX_LITERAL_EXPONENT", "load_kernelbench_module", "module_constants"]


def module_constants(module: types.ModuleType) -> dict[str, int | float]:
    """The module's public numeric constants (its shapes; booleans are not numbers here)."""
    return {
        k: v
        for k, v in vars(module).items()
        if not k.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _exec_module(code: types.CodeType, path: Path, what: str) -> types.ModuleType:
    module = types.ModuleType(f"kf_problem_{path.stem}")
    module.__file__ = str(path)
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as exc:  # a file that exits while loading is an error, not an exit
        raise ProblemError(
            one_line(f"{path}: error while loading{what}: {type(exc).__name__}: {exc}")
        ) from None
    return module


#: Literal exponents and shift counts above this are refused before the module runs: ``1 << 10**12``
#: at module level would try to build a number the size of the machine's memory.
MAX_LITERAL_EXPONENT = 4096


def _parse(source: str, path: Path) -> ast.Module:
    """The problem file's syntax tree, with no literal exponent or shift past the bound."""
    try:
        tree = ast.parse(source, str(path))
    except SyntaxError as exc:
        raise ProblemError(one_line(f"{path}:{exc.lineno}: syntax error: {exc.msg}")) from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        raise ProblemError(one_line(f"{path}: cannot parse: {type(exc).__name__}: {exc}")) from None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Pow | ast.LShift)
            and isinstance(node.right, ast.Constant)
            and isinstance(node.right.value, int | float)
            and abs(node.right.value) > MAX_LITERAL_EXPONENT
        ):
            raise ProblemError(
                f"{path}:{node.lineno}: exponent or shift {node.right.value} is larger than {MAX_LITERAL_EXPONENT}"
            )
    return tree


def _compile(tree: ast.Module | str, path: Path) -> types.CodeType:
    try:
        return compile(tree, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise ProblemError(one_line(f"{path}:{exc.lineno}: syntax error: {exc.msg}")) from None
    except (ValueError, TypeError, RecursionError, MemoryError, OverflowError) as exc:
        raise ProblemError(one_line(f"{path}: cannot compile: {type(exc).__name__}: {exc}")) from None


_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Lambda,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def _stored_names(node: ast.AST, out: dict[str, list[ast.Assign | ast.AnnAssign | None]]) -> None:
    """Names bound at module scope anywhere inside ``node`` (not inside functions, classes, comprehensions)."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        out.setdefault(node.id, []).append(None)
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, _SCOPES):
            _stored_names(child, out)


def _assignments(tree: ast.Module) -> dict[str, list[ast.Assign | ast.AnnAssign | None]]:
    """Every module-level binding of each name: a plain ``NAME = value`` line, or None for any other."""
    out: dict[str, list[ast.Assign | ast.AnnAssign | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out.setdefault(node.targets[0].id, []).append(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out.setdefault(node.target.id, []).append(node)
        elif not isinstance(node, _SCOPES):  # tuple targets, loops, augmented assignment, ``with ... as``
            _stored_names(node, out)
    return out


def split_assignments(body: list[ast.stmt]) -> list[ast.stmt]:
    """``a, b = 1, 2`` and ``a = b = 1`` as one ``NAME = value`` line per name (KernelBench writes
    ``height, width = 128, 128``), so each name can be overridden; other statements are kept as they are."""
    out: list[ast.stmt] = []
    for node in body:
        if not isinstance(node, ast.Assign):
            out.append(node)
            continue
        t, value = node.targets, node.value
        if len(t) == 1 and isinstance(t[0], ast.Tuple) and isinstance(value, ast.Tuple):
            names, values = t[0].elts, value.elts
            if (
                len(names) == len(values)
                and all(isinstance(n, ast.Name) for n in names)
                and all(isinstance(v, ast.Constant) for v in values)
            ):
                out += [
                    ast.copy_location(ast.Assign([n], v), node) for n, v in zip(names, values, strict=True)
                ]
                continue
        if len(t) > 1 and all(isinstance(n, ast.Name) for n in t) and isinstance(value, ast.Constant):
            out += [ast.copy_location(ast.Assign([n], value), node) for n in t]
            continue
        out.append(node)
    return out


def _overridden(
    path: Path,
    source: str,
    tree: ast.Module,
    constants: dict[str, int | float],
    shapes: dict[str, int | float],
) -> ast.Module:
    """``tree`` with each overridden constant's ``NAME = value`` line(s) set to the new value.

    Re-running the module then recomputes what is derived from it (``bias_shape = (out_channels, 1, 1)``).
    A constant that is not set by plain assignment lines, or an int given a fraction, is refused.
    """
    tree.body = split_assignments(tree.body)
    bindings = _assignments(tree)
    for name, value in shapes.items():
        if name not in constants:
            known = ", ".join(sorted(constants)) or "none"
            raise ProblemError(one_line(f"{path}: unknown shape constant {name!r} (known: {known})"))
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProblemError(f"{path}: cannot set {name}: a {type(value).__name__} is not a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise ProblemError(f"{path}: cannot set {name}: {value} is not a finite number")
        if abs(value) >= 2**63:
            raise ProblemError(f"{path}: cannot set {name}: the value is out of range (|value| >= 2**63)")
        if isinstance(constants[name], int) and not float(value).is_integer():
            raise ProblemError(f"{path}: cannot set {name}={value}: {name} is an integer constant")
        lines = bindings.get(name, [])
        if not lines or any(line is None for line in lines):
            raise ProblemError(
                f"{path}: cannot set {name}: it is not set by plain `{name} = ...` lines at module level "
                "(so what depends on it could not be recomputed)"
            )
        new = int(value) if isinstance(constants[name], int) else float(value)
        for line in lines:
            assert line is not None
            line.value = ast.copy_location(ast.Constant(new), line.value or line)
    return ast.fix_missing_locations(tree)


def load_kernelbench_module(path: Path, shapes: dict[str, int | float]) -> tuple[str, types.ModuleType]:
    """The file's source and its module, run with ``shapes`` overriding its constants.

    Raises :class:`ProblemError` (one line) for an unreadable or oversized file, a syntax error, an
    error while it runs, an override that cannot be applied, no ``Model`` or no ``get_inputs``.
    """
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ProblemError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, not a problem file")
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(one_line(f"cannot read problem {path}: {exc}")) from None
    module = _exec_module(_compile(_parse(source, path), path), path, "")
    constants = module_constants(module)
    if shapes:
        tree = _overridden(path, source, _parse(source, path), constants, shapes)
        given = ", ".join(f"{k}={v}" for k, v in shapes.items())
        module = _exec_module(_compile(tree, path), path, f" with {given}")
    model = getattr(module, "Model", None)
    if not (isinstance(model, type) and issubclass(model, nn.Module)):
        raise ProblemError(f"{path}: no Model class (an nn.Module) defined")
    if not callable(getattr(module, "get_inputs", None)):
        raise ProblemError(f"{path}: no get_inputs() function defined")
    return source, module
