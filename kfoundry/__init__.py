"""kfoundry: find fast, correct GPU kernels automatically.

The Python API (:mod:`kfoundry.api`) is importable from here: ``kfoundry.optimize``,
``kfoundry.evaluate``, ``kfoundry.tune``, ``kfoundry.export`` (loaded on first use, so plugins that
only need :data:`hookimpl` stay light).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

__version__ = "0.1.0"

PROJECT_NAME = "kfoundry"

#: Decorator for plugin hook implementations: ``@hookimpl def kf_register_backends(register): ...``
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

_API = (
    "optimize",
    "resume",
    "evaluate",
    "tune",
    "export",
    "OptimizeResult",
    "KernelResult",
    "ShapeResult",
    "ExportResult",
)

if TYPE_CHECKING:
    from kfoundry.api import (
        ExportResult,
        KernelResult,
        OptimizeResult,
        ShapeResult,
        evaluate,
        export,
        optimize,
        resume,
        tune,
    )


def __getattr__(name: str) -> Any:
    if name in _API:
        from kfoundry import api

        return getattr(api, name)
    raise AttributeError(f"module 'kfoundry' has no attribute {name!r}")


__all__ = [
    "__version__",
    "hookimpl",
    "PROJECT_NAME",
    "optimize",
    "resume",
    "evaluate",
    "tune",
    "export",
    "OptimizeResult",
    "KernelResult",
    "ShapeResult",
    "ExportResult",
]
