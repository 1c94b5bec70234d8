"""kfoundry: find fast, correct GPU kernels automatically."""

from __future__ import annotations

import pluggy

__version__ = "0.1.0"

PROJECT_NAME = "kfoundry"

#: Decorator for plugin hook implementations: ``@hookimpl def kf_register_backends(register): ...``
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = ["__version__", "hookimpl", "PROJECT_NAME"]
