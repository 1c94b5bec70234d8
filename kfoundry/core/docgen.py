"""Generate the reference docs: docs/config.md from the pydantic config models and every registered
plugin's options, docs/hooks.md from the hook specs' signatures and docstrings.

``python -m kfoundry.core.docgen > docs/config.md`` and ``python -m kfoundry.core.docgen hooks >
docs/hooks.md``; a test fails when either file is stale.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kfoundry.core.config import RunConfig
from kfoundry.core.plugins import REGISTRATION_HOOKS, PluginManager, get_plugin_manager

HEADER = """# Configuration reference

Generated from the pydantic models by `python -m kfoundry.core.docgen > docs/config.md`
(a test fails when this file is stale). A run config is a TOML file (`kf-run ... --config kf.toml`)
plus `--set key.path=value` overrides; every key has a default, and an unknown key is an error
that names its path.
"""


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    return text.replace("NoneType", "None")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        return "(table)" if isinstance(value, BaseModel) else f"`{value!r}`"
    return f"`{field.default!r}`"


def _describe(field: FieldInfo) -> str:
    return (field.description or "").replace("|", "\\|")


def model_table(model: type[BaseModel], prefix: str) -> list[str]:
    """Markdown rows for one model's fields, recursing into nested sections."""
    rows: list[str] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            nested.append((f"{prefix}{name}", annotation))
            continue
        key = f"{prefix}{name}"
        rows.append(f"| `{key}` | `{_type_name(annotation)}` | {_default(field)} | {_describe(field)} |")
    out = ["| key | type | default | meaning |", "|---|---|---|---|", *rows] if rows else []
    for key, sub in nested:
        doc = (sub.__doc__ or "").strip().split("\n")[0]
        out += ["", f"### `[{key}]`", "", doc, "", *model_table(sub, f"{key}.")]
    return out


def render(manager: PluginManager | None = None) -> str:
    """The whole reference as Markdown."""
    manager = manager or get_plugin_manager()
    lines = [HEADER, "## Run config", "", *model_table(RunConfig, "")]
    lines += ["", "Each `[[llms]]` entry: `name`, `weight`, `model`, `options`.", ""]
    lines += [
        "## Plugin options",
        "",
        "Set under the section's `options` table, e.g. `[search.options]`.",
        "",
    ]
    for kind in REGISTRATION_HOOKS:
        for spec in manager.registry(kind):
            lines += [f"### {kind} `{spec.name}` ({spec.package})", "", spec.description, ""]
            table = model_table(spec.options_model, "")
            lines += table if table else ["No options."]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


HOOKS_HEADER = """# Hook reference

Generated from `kfoundry/core/hookspecs.py` by `python -m kfoundry.core.docgen hooks > docs/hooks.md`
(a test fails when this file is stale). Implement a hook with `@kfoundry.hookimpl` on a function of
the same name in a module that a `kfoundry` entry point names (see docs/plugins.md); an
implementation may take fewer parameters than the spec, never others.
"""

_FIELD = re.compile(r"^:(param (\w+)|return):\s*(.*)$")
_ROLE = re.compile(r":\w+:`~?([^`]+)`")


def _markdown(text: str) -> str:
    """reStructuredText inline markup as Markdown: ``:class:`X```, ````x```` -> ```X```, ```x```."""
    return _ROLE.sub(r"`\1`", text).replace("``", "`")


def _hook_doc(doc: str) -> list[str]:
    """A hook docstring as Markdown: ``:param x:`` and ``:return:`` fields become a list."""
    out: list[str] = []
    for line in inspect.cleandoc(doc).splitlines():
        field = _FIELD.match(line)
        if field:
            name = f"`{field.group(2)}`" if field.group(2) else "returns"
            out.append(f"- {name}: {field.group(3)}".rstrip())
        elif line.startswith("    ") and out and out[-1].startswith("- "):
            out[-1] = f"{out[-1]} {line.strip()}".replace(":  ", ": ", 1)
        else:
            out.append(line)
    return [_markdown(line) for line in out]


def _signature(name: str, spec: Any) -> str:
    """``def name(param: Type, ...) -> Return: ...`` with the annotations as written in the spec."""
    sig = inspect.signature(spec)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"def {name}({params}) -> {sig.return_annotation}: ..."


def render_hooks() -> str:
    """Every hook of :mod:`kfoundry.core.hookspecs`, registration hooks first, as Markdown."""
    from kfoundry.core import hookspecs

    names = [n for n in hookspecs.__all__ if n.startswith("kf_")]
    order = {n: i for i, n in enumerate(n for n in vars(hookspecs) if n.startswith("kf_"))}
    groups = {
        "Registration hooks": [n for n in names if n.startswith("kf_register_")],
        "Lifecycle hooks": [n for n in names if not n.startswith("kf_register_")],
    }
    lines = [HOOKS_HEADER]
    for title, members in groups.items():
        lines += [f"## {title}", ""]
        for name in sorted(members, key=order.__getitem__):
            spec = getattr(hookspecs, name)
            lines += [f"### `{name}`", "", "```python", _signature(name, spec), "```", ""]
            lines += [*_hook_doc(spec.__doc__ or ""), ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover
    what = sys.argv[1] if len(sys.argv) > 1 else "config"
    if what not in ("config", "hooks"):
        sys.stderr.write(f"usage: python -m kfoundry.core.docgen [config|hooks] (got {what!r})\n")
        sys.exit(2)
    sys.stdout.write(render_hooks() if what == "hooks" else render())
