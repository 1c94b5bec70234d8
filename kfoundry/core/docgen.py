"""Generate docs/config.md from the pydantic config models and every registered plugin's options.

``python -m kfoundry.core.docgen > docs/config.md``; a test fails when the file is stale.
"""

from __future__ import annotations

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
    lines += ["## Plugin options", "", "Set under the section's `options` table, e.g. `[search.options]`.", ""]
    for kind in REGISTRATION_HOOKS:
        for spec in manager.registry(kind):
            lines += [f"### {kind} `{spec.name}` ({spec.package})", "", spec.description, ""]
            table = model_table(spec.options_model, "")
            lines += table if table else ["No options."]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(render())
