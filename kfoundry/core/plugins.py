"""Plugin manager: loads entry points of group ``kfoundry`` and collects their registrations.

Environment controls:
- ``KF_DISABLE_PLUGINS=a,b``: skip the named plugins (entry-point names).
- ``KF_LOAD_PLUGINS=a,b``: load only the named plugins.

A plugin that fails to import, or whose hooks have a bad signature, costs a one-line warning
naming its package; it never takes the tool down.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import pluggy
from pydantic import BaseModel, ConfigDict

from kfoundry import PROJECT_NAME
from kfoundry.core import hookspecs
from kfoundry.core.errors import PluginError

PluginKind = Literal["backend", "llm", "search", "tuner", "hardware", "executor", "descriptor", "language"]

#: Registration hook name for each plugin kind.
REGISTRATION_HOOKS: dict[PluginKind, str] = {
    "backend": "kf_register_backends",
    "llm": "kf_register_llms",
    "search": "kf_register_search",
    "tuner": "kf_register_tuners",
    "hardware": "kf_register_hardware",
    "executor": "kf_register_executors",
    "descriptor": "kf_register_descriptors",
    "language": "kf_register_languages",
}


class NoOptions(BaseModel):
    """Options model of a plugin that takes no options."""

    model_config = ConfigDict(extra="forbid")


class PluginWarning(UserWarning):
    """A plugin was skipped (import error, bad hook signature)."""


@dataclass(frozen=True)
class PluginSpec:
    """One registered name: what it is, who provides it and how to build it."""

    kind: PluginKind
    name: str
    factory: Callable[..., Any]
    options_model: type[BaseModel]
    description: str
    plugin: str
    package: str
    version: str

    def build(self, options: BaseModel | dict[str, Any] | None = None) -> Any:
        """Validate ``options`` against the options model and call the factory."""
        if not isinstance(options, BaseModel):
            options = self.options_model.model_validate(options or {})
        return self.factory(options)


@dataclass
class PluginInfo:
    """A loaded plugin module (an entry point or one registered in-process)."""

    name: str
    package: str
    version: str
    hooks: list[str] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=dict)


class Registry:
    """Registered names of one plugin kind; names are unique."""

    def __init__(self, kind: PluginKind) -> None:
        self.kind = kind
        self._specs: dict[str, PluginSpec] = {}

    def add(self, spec: PluginSpec) -> None:
        existing = self._specs.get(spec.name)
        if existing is not None:
            raise PluginError(
                f"{self.kind} name {spec.name!r} registered twice: by {existing.package} "
                f"(plugin {existing.plugin}) and by {spec.package} (plugin {spec.plugin})"
            )
        self._specs[spec.name] = spec

    def get(self, name: str) -> PluginSpec:
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            raise PluginError(f"unknown {self.kind} plugin {name!r} (known: {known})") from None

    def names(self) -> list[str]:
        return sorted(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[PluginSpec]:
        return iter(self._specs[name] for name in self.names())


def _env_names(var: str) -> set[str]:
    return {part.strip() for part in os.environ.get(var, "").split(",") if part.strip()}


class PluginManager:
    """Loads plugins and owns the registries of every kind."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self.registries: dict[PluginKind, Registry] = {k: Registry(k) for k in REGISTRATION_HOOKS}
        self.skipped: list[str] = []

    # -- loading --------------------------------------------------------------------------------

    def load_entry_points(self) -> None:
        """Load every entry point of group ``kfoundry``, honouring the environment controls."""
        disabled = _env_names("KF_DISABLE_PLUGINS")
        only = _env_names("KF_LOAD_PLUGINS")
        for ep in sorted(md.entry_points(group=PROJECT_NAME), key=lambda e: e.name):
            if ep.name in disabled or (only and ep.name not in only) or ep.name in self.infos:
                continue
            dist = ep.dist
            package = dist.metadata["Name"] if dist is not None else "unknown"
            version = dist.version if dist is not None else "unknown"
            try:
                module = ep.load()
            except Exception as exc:  # a broken third-party plugin must not take the tool down
                self._skip(ep.name, package, f"import failed: {type(exc).__name__}: {exc}")
                continue
            self.add_plugin(module, ep.name, package=package, version=version)

    def add_plugin(
        self, module: ModuleType | object, name: str, *, package: str = "", version: str = ""
    ) -> bool:
        """Register one plugin object and run its registration hooks. False if it was skipped."""
        package = package or getattr(module, "__name__", name)
        try:
            self.pm.register(module, name=name)
            self.pm.check_pending()
        except (pluggy.PluginValidationError, ValueError) as exc:
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            self._skip(name, package, f"bad hook: {str(exc).splitlines()[0]}")
            return False
        hooks = sorted(impl_name for impl_name in dir(module) if impl_name.startswith("kf_"))
        info = PluginInfo(name=name, package=package, version=version or "", hooks=hooks)
        self.infos[name] = info
        try:
            self._collect_registrations(module, info)
        except PluginError:
            self.remove_plugin(name)
            raise
        return True

    def remove_plugin(self, name: str) -> None:
        """Unregister a plugin and every name it registered."""
        info = self.infos.pop(name, None)
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)
        if info is None:
            return
        for kind, names in info.registered.items():
            registry = self.registries[kind]  # type: ignore[index]
            for n in names:
                registry._specs.pop(n, None)

    def _skip(self, name: str, package: str, why: str) -> None:
        message = f"kfoundry: skipped plugin {name!r} from package {package}: {why}"
        self.skipped.append(message)
        warnings.warn(message, PluginWarning, stacklevel=3)

    def _collect_registrations(self, module: object, info: PluginInfo) -> None:
        for kind, hook_name in REGISTRATION_HOOKS.items():
            impl = getattr(module, hook_name, None)
            if impl is None:
                continue
            registry = self.registries[kind]

            def register(
                name: str,
                factory: Callable[..., Any],
                *,
                options: type[BaseModel] | None = None,
                description: str = "",
                _kind: PluginKind = kind,
                _registry: Registry = registry,
            ) -> None:
                if not isinstance(name, str) or not name:
                    raise PluginError(
                        f"plugin {info.name} ({info.package}) registered a {_kind} with no name"
                    )
                if not callable(factory):
                    raise PluginError(f"{_kind} {name!r} from {info.package}: factory is not callable")
                spec = PluginSpec(
                    kind=_kind,
                    name=name,
                    factory=factory,
                    options_model=options or NoOptions,
                    description=description or (getattr(factory, "__doc__", "") or "").strip().split("\n")[0],
                    plugin=info.name,
                    package=info.package,
                    version=info.version,
                )
                _registry.add(spec)
                info.registered.setdefault(_kind, []).append(name)

            impl(register=register)

    # -- queries --------------------------------------------------------------------------------

    def registry(self, kind: PluginKind) -> Registry:
        return self.registries[kind]

    def get(self, kind: PluginKind, name: str) -> PluginSpec:
        return self.registries[kind].get(name)

    @property
    def hook(self) -> Any:
        return self.pm.hook


_lock = threading.Lock()
_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, loading entry points on first use."""
    global _manager
    with _lock:
        if _manager is None:
            manager = PluginManager()
            manager.load_entry_points()
            _manager = manager
        return _manager


def reset_plugin_manager() -> None:
    """Forget the loaded plugins (the next :func:`get_plugin_manager` reloads entry points)."""
    global _manager
    with _lock:
        _manager = None


def get_plugin(kind: PluginKind, name: str) -> PluginSpec:
    """Shortcut: the registered plugin ``name`` of ``kind``."""
    return get_plugin_manager().get(kind, name)
