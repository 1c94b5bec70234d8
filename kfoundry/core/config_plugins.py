"""The plugins a run config names: found, their ``options`` validated and filled in, built.

Each plugin's ``options`` table is validated against the options model that plugin registered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from kfoundry.core.config_io import format_validation_error, short_repr
from kfoundry.core.errors import ConfigError, PluginError
from kfoundry.core.plugins import PluginKind, PluginManager, get_plugin_manager

if TYPE_CHECKING:
    from kfoundry.core.config import PluginChoice, RunConfig

__all__ = ["build_plugin", "plugin_choices", "plugin_options", "resolved_config", "validate_plugin_options"]


def plugin_choices(config: RunConfig) -> list[tuple[str, PluginKind, PluginChoice]]:
    """Every plugin a config names: (key path, kind, choice)."""
    choices: list[tuple[str, PluginKind, PluginChoice]] = [
        ("backend", "backend", config.backend),
        ("search", "search", config.search),
        ("tuner", "tuner", config.tuner),
        ("executor", "executor", config.executor),
    ]
    choices += [(f"llms[{i}]", "llm", llm) for i, llm in enumerate(config.llms)]
    return choices


def validate_plugin_options(config: RunConfig, manager: PluginManager, source: str = "") -> None:
    """Check every named plugin exists and its ``options`` match its options model."""
    where = f" in {source}" if source else ""
    for key, kind, choice in plugin_choices(config):
        try:
            spec = manager.get(kind, choice.name)
        except PluginError as exc:
            raise ConfigError(f"config error{where}: {key}.name: {exc}") from None
        try:
            spec.options_model.model_validate(choice.options)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, prefix=f"{key}.options", source=source)) from None
        except (TypeError, ValueError, RecursionError) as exc:  # a plugin's validator raised past pydantic
            raise ConfigError(
                f"config error{where}: {key}.options: {type(exc).__name__}: {short_repr(str(exc))}"
            ) from None


def plugin_options(choice: PluginChoice, kind: PluginKind, manager: PluginManager | None = None) -> BaseModel:
    """The validated options model instance for a configured plugin."""
    spec = (manager or get_plugin_manager()).get(kind, choice.name)
    return spec.options_model.model_validate(choice.options)


def build_plugin(choice: PluginChoice, kind: PluginKind, manager: PluginManager | None = None) -> Any:
    """Build the plugin object a config section names."""
    spec = (manager or get_plugin_manager()).get(kind, choice.name)
    return spec.build(choice.options)


def resolved_config(config: RunConfig, manager: PluginManager | None = None) -> dict[str, Any]:
    """The config as plain data with every plugin's option defaults filled in."""
    data = config.model_dump(mode="json")
    manager = manager or get_plugin_manager()
    for key, kind, choice in plugin_choices(config):
        try:
            options = plugin_options(choice, kind, manager).model_dump(mode="json")
        except (PluginError, ValidationError):
            continue
        if key.startswith("llms["):
            data["llms"][int(key[5:-1])]["options"] = options
        else:
            data[key]["options"] = options
    return data
