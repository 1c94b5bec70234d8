"""What a ``kf-run mcp`` server is started with: its runs root and its base run config."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfoundry.core.config import RunConfig, apply_override, load_config, parse_override, read_toml
from kfoundry.core.errors import ConfigError, KfError
from kfoundry.core.plugins import get_plugin


@dataclass
class ServerSettings:
    """The runs root (run folders and the evaluation cache live there) and the base config data."""

    runs_root: Path
    base: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(
        cls, runs_root: str | Path | None, config_path: str | None = None, sets: tuple[str, ...] = ()
    ) -> ServerSettings:
        """Settings from ``--runs-root``, ``--config`` and ``--set``; the result is validated once here."""
        base: dict[str, Any] = read_toml(config_path) if config_path else {}
        for text in sets:
            key_path, value = parse_override(text)
            apply_override(base, key_path, value)
        config = load_config(data=base)
        root = Path(runs_root) if runs_root else Path(config.output_dir)
        return cls(runs_root=root.resolve(), base=base)

    def config(
        self,
        overrides: dict[str, Any],
        backend: str | None = None,
        shapes: dict[str, int | float] | None = None,
        validate_plugins: bool = True,
    ) -> RunConfig:
        """The base config with a call's overrides (dotted key paths), backend and shapes (validated as
        ``problem.shapes``, over the base config's) applied, writing under the runs root."""
        raw = copy.deepcopy(self.base)
        for key, value in overrides.items():
            path = [part for part in key.split(".") if part]
            if not path:
                raise ConfigError(f"overrides: empty key {key!r}")
            if path[0] == "output_dir":
                raise ConfigError("overrides.output_dir: set by the server (kf-run mcp --runs-root)")
            apply_override(raw, path, value)
        if backend is not None:
            apply_override(raw, ["backend", "name"], backend)
        for name, value in (shapes or {}).items():
            apply_override(raw, ["problem", "shapes", name], value)
        raw["output_dir"] = str(self.runs_root)
        return load_config(data=raw, validate_plugins=validate_plugins)


def backend_language(config: RunConfig) -> str:
    """The configured backend's kernel language, read from its class (no device is touched)."""
    try:
        factory = get_plugin("backend", config.backend.name).factory
    except KfError:
        return "opencl"  # the evaluator reports an unknown backend properly later
    return str(getattr(factory, "language", "opencl"))
