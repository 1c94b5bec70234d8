"""Static checks on a candidate's source, before anything is compiled or run.

A KernelBench candidate may import only a few modules (torch, math, numpy, ``kfoundry.runtime``),
may not reach into the interpreter (``eval``, ``gc``, ``sys``, dispatch-mode internals...), may not
inherit from the reference ``Model``, and its ``forward`` may allocate and reshape but not compute
with torch. Plugins add their own vetoes through ``kf_static_checks``
(:func:`kfoundry.core.hooks.static_checks`). The runtime guard (:mod:`.guard`) backs these up.

These checks are policy and an early, cheap "no", not the trust boundary: a candidate that gets past
them (re-exported modules, computed names) still runs only in the confined runner process, which
holds nothing that judges it (docs/evaluation.md, "Threat model"). So they stay narrow enough not
to reject honest code: ``getattr`` to pick a kernel variant, a parameter named ``input`` and
``kfoundry.runtime.synchronize()`` are allowed.
"""

from __future__ import annotations

import ast

from kfoundry.core.languages import allowed_imports
from kfoundry.core.models import Candidate

ALLOWED_IMPORTS = {
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "math",
    "numpy",
    "kfoundry.runtime",
    "typing",
    "__future__",
    "dataclasses",
    "functools",
    "itertools",
    "collections",
    "textwrap",
}

BANNED_NAMES = {
    "eval",
    "exec",
    "compile",
    "__import__",
    "globals",
    "locals",
    "vars",
    "setattr",
    "delattr",
    "open",
    "breakpoint",
    "__builtins__",
    "memoryview",
}

BANNED_ATTRIBUTES = {
    "_disable_current_modes",
    "_get_current_dispatch_mode",
    "__torch_dispatch__",
    "__torch_function__",
    "_python_dispatch",
    "_C",
    "_dynamo",
    "__globals__",
    "__code__",
    "__closure__",
    "__subclasses__",
    "__dict__",
    "__class__",
    "__bases__",
    "__mro__",
    "f_back",
    "f_globals",
    "modules",
    "perf_counter",
    "perf_counter_ns",
}

#: torch functions a ``forward`` may call: allocation, views and shape queries.
FORWARD_TORCH_OK = {
    "empty",
    "empty_like",
    "empty_strided",
    "zeros",
    "zeros_like",
    "ones",
    "ones_like",
    "full",
    "full_like",
    "Size",
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int32",
    "int64",
    "int8",
    "uint8",
    "bool",
    "device",
    "no_grad",
    "is_tensor",
    "numel",
    "arange",
}


def _dotted(node: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _imports(tree: ast.AST, allowed: set[str] = ALLOWED_IMPORTS) -> list[str]:
    reasons: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                reasons.append(f"line {node.lineno}: relative import")
                continue
            names = [mod] if mod in allowed else [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name not in allowed:
                reasons.append(f"line {node.lineno}: import of {name} is not allowed in a candidate")
    return reasons


def _names(tree: ast.AST) -> list[str]:
    reasons: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in BANNED_NAMES:
            reasons.append(f"line {node.lineno}: use of {node.id} is not allowed in a candidate")
        elif isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRIBUTES:
            reasons.append(f"line {node.lineno}: access to .{node.attr} is not allowed in a candidate")
    return reasons


def _imported_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _patching(tree: ast.AST) -> list[str]:
    """Assignments to attributes of imported modules or names (monkey-patching torch, numpy, the harness);
    the candidate's own objects (``self``, ``cls``, its classes and instances) are its own business."""
    reasons: list[str] = []
    imported = _imported_names(tree)
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and _dotted(sub).split(".")[0] in imported:
                    line = getattr(node, "lineno", "?")
                    reasons.append(f"line {line}: assignment to {_dotted(sub)} (patching) is not allowed")
    return reasons


def _torch_aliases(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names bound to the torch module and to torch.nn.functional."""
    torch_names, functional = {"torch"}, {"F"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch":
                    torch_names.add(a.asname or "torch")
                if a.name == "torch.nn.functional" and a.asname:
                    functional.add(a.asname)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.nn":
            functional.update(a.asname or a.name for a in node.names if a.name == "functional")
    return torch_names, functional


def _model_new(tree: ast.Module) -> list[str]:
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    if cls is None:
        return []
    reasons = [
        f"line {cls.lineno}: ModelNew may not inherit from the reference Model"
        for base in cls.bases
        if _dotted(base).split(".")[-1] == "Model"
    ]
    torch_names, functional = _torch_aliases(tree)
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                reasons.append(f"line {node.lineno}: '@' in {fn.name}: compute must run in a kernel")
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func)
            head, _, rest = name.partition(".")
            if head in torch_names and rest and rest.split(".")[0] == "nn":
                reasons.append(f"line {node.lineno}: {name} in {fn.name}: compute must run in a kernel")
            elif head in torch_names and rest and rest not in FORWARD_TORCH_OK:
                reasons.append(f"line {node.lineno}: torch.{rest} in {fn.name}: compute must run in a kernel")
            elif head in functional and rest:
                reasons.append(f"line {node.lineno}: {name} in {fn.name}: compute must run in a kernel")
    return reasons


def check_source(candidate: Candidate) -> list[str]:
    """Reasons to reject ``candidate`` before compiling (empty: accepted).

    A Python syntax error is not a reason here: building the candidate reports it as a compile error.
    """
    if not candidate.source.strip():
        return ["empty source"]
    if candidate.kind == "native":
        return []
    try:
        tree = ast.parse(candidate.source)
    except SyntaxError:
        return []
    allowed = ALLOWED_IMPORTS | allowed_imports(candidate.language)  # a language's own (load_inline, triton)
    return _imports(tree, allowed) + _names(tree) + _patching(tree) + _model_new(tree)
