"""The language registry: every kernel language a backend (or a small language plugin) brings.

A plugin registers a :class:`LanguageSpec` from its ``kf_register_languages`` hook::

    @hookimpl
    def kf_register_languages(register):
        register("metal", LanguageSpec(name="metal", suffixes=(".metal",), fences=("metal",)))

A spec is its own factory (calling it returns it), so ``register(spec.name, spec)`` is all it takes.
The rest of kfoundry asks this module, never a list of its own: which file suffixes a candidate of the
language has (the first is the export suffix), which code-fence names the reply parser takes, whether
a candidate is a native kernel file or a Python ``ModelNew`` file, and the prompt template (Jinja text;
empty: ``templates/<name>.j2`` of :mod:`kfoundry.core.llm`). A language's behaviour-descriptor extractor
is registered under the same name through ``kf_register_descriptors``.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from kfoundry.core.errors import KfError
from kfoundry.core.models import DEFAULT_LANGUAGE
from kfoundry.core.plugins import PluginManager, PluginWarning, get_plugin_manager

__all__ = [
    "DEFAULT_LANGUAGE",
    "LanguageSpec",
    "UnknownLanguage",
    "allowed_imports",
    "check_language",
    "export_suffix",
    "fence_names",
    "get_language",
    "known_languages",
    "language_for_suffix",
]

_NAME = re.compile(r"[a-z][a-z0-9_+-]{0,31}")
_SUFFIX = re.compile(r"\.[A-Za-z0-9_+-]{1,16}")
_warned: set[str] = set()


class UnknownLanguage(KfError):
    """A candidate or task names a language no loaded plugin registered."""


@dataclass(frozen=True)
class LanguageSpec:
    """What the rest of kfoundry needs to know about one kernel language."""

    name: str
    #: File suffixes of a candidate in this language, with the dot; the first is the export suffix.
    suffixes: tuple[str, ...]
    #: Code-fence names (```` ```cuda ````) under which the reply parser takes a kernel of this language.
    fences: tuple[str, ...] = ()
    #: ``native``: a candidate file is raw kernel source; ``python``: a ``ModelNew`` module whose kernels
    #: are Python (Triton), so its files are ``.py`` and the KernelBench harness runs them.
    candidate_kind: Literal["native", "python"] = "native"
    #: Jinja template of the generation prompt (extends ``base.j2``); empty: ``templates/<name>.j2``.
    prompt_template: str = ""
    description: str = ""
    #: Modules a Python candidate of this language may import beyond the static check's default set.
    allowed_imports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise KfError(f"language name {self.name!r}: expected lower-case letters, digits, _ + - (max 32)")
        if not self.suffixes or not all(isinstance(s, str) and _SUFFIX.fullmatch(s) for s in self.suffixes):
            raise KfError(
                f"language {self.name}: suffixes {self.suffixes!r}: expected one or more like '.cl'"
            )
        if self.candidate_kind not in ("native", "python"):
            raise KfError(f"language {self.name}: candidate_kind must be 'native' or 'python'")
        # what `kf-run plugins` and docs/config.md show for the registered name (the factory's doc)
        object.__setattr__(self, "__doc__", self.description or f"the {self.name} kernel language")

    def __call__(self, _options: Any = None) -> LanguageSpec:
        """A spec is its own registry factory."""
        return self

    @property
    def export_suffix(self) -> str:
        return self.suffixes[0]


def _specs(manager: PluginManager | None) -> dict[str, LanguageSpec]:
    registry = (manager or get_plugin_manager()).registry("language")
    out: dict[str, LanguageSpec] = {}
    for plugin in registry:
        spec = plugin.build()
        if not isinstance(spec, LanguageSpec) or spec.name != plugin.name:
            message = (
                f"kfoundry: language {plugin.name!r} from {plugin.package} skipped: its factory must return "
                f"a LanguageSpec named {plugin.name!r}"
            )
            if message not in _warned:
                _warned.add(message)
                warnings.warn(message, PluginWarning, stacklevel=3)
            continue
        out[spec.name] = spec
    return out


def known_languages(manager: PluginManager | None = None) -> list[str]:
    """The registered language names, sorted."""
    return sorted(_specs(manager))


def get_language(name: str, manager: PluginManager | None = None) -> LanguageSpec:
    """The registered spec of ``name``; :class:`UnknownLanguage` (one line, naming the known ones) if none."""
    specs = _specs(manager)
    if isinstance(name, str) and name in specs:
        return specs[name]
    known = ", ".join(sorted(specs)) or "none (no backend plugin loaded)"
    raise UnknownLanguage(
        f"unknown kernel language {name!r} (known: {known}; a backend plugin registers more)"
    )


def language_for_suffix(suffix: str, manager: PluginManager | None = None) -> LanguageSpec:
    """The language whose suffixes hold ``suffix`` (``.cu`` -> cuda); the first registered on a tie."""
    for spec in _specs(manager).values():
        if suffix in spec.suffixes:
            return spec
    known = sorted({s for spec in _specs(manager).values() for s in spec.suffixes})
    raise UnknownLanguage(
        f"no kernel language has file suffix {suffix!r} (known: {', '.join(known) or 'none'})"
    )


def export_suffix(name: str, manager: PluginManager | None = None) -> str:
    """The file suffix an exported kernel of language ``name`` gets (``.cl``, ``.cu``, ``.py``...)."""
    return get_language(name, manager).export_suffix


def fence_names(manager: PluginManager | None = None) -> set[str]:
    """Every code-fence name some registered language claims (lower case)."""
    return {fence.lower() for spec in _specs(manager).values() for fence in spec.fences}


def allowed_imports(name: str, manager: PluginManager | None = None) -> set[str]:
    """Modules a Python candidate in language ``name`` may import beyond the default set (none if unknown)."""
    try:
        return set(get_language(name, manager).allowed_imports)
    except UnknownLanguage:
        return set()


def check_language(name: object, where: str, manager: PluginManager | None = None) -> str:
    """``name`` if it is a registered language, else :class:`UnknownLanguage` naming ``where``."""
    try:
        return get_language(name if isinstance(name, str) else repr(name), manager).name
    except UnknownLanguage as exc:
        raise UnknownLanguage(f"{where}: {exc}") from None
