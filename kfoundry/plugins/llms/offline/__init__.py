"""The offline generator plugin (no language model): registers the ``offline`` generator.

The behaviour descriptors of each language are registered by its backend, not here
(:mod:`kfoundry.core.behaviour.registry`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kfoundry import hookimpl
from kfoundry.core.hookspecs import Register
from kfoundry.plugins.llms.offline.options import OfflineOptions

if TYPE_CHECKING:
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator

__all__ = ["OfflineGenerator", "OfflineOptions"]


def __getattr__(name: str) -> Any:
    """``OfflineGenerator`` on first use: it traces problems with torch.fx, so it imports torch."""
    if name == "OfflineGenerator":
        from kfoundry.plugins.llms.offline.generator import OfflineGenerator

        return OfflineGenerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _offline(options: OfflineOptions | None = None) -> OfflineGenerator:
    from kfoundry.plugins.llms.offline.generator import OfflineGenerator

    return OfflineGenerator(options)


@hookimpl
def kf_register_llms(register: Register) -> None:
    register(
        "offline",
        _offline,
        options=OfflineOptions,
        description="cookbook kernels for recognised operation families (no language model)",
    )
