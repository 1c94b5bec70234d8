"""pytest plugin for kfoundry and its third-party plugins (auto-loaded through ``pytest11``).

Fixtures:
- ``kf_plugin_manager``: a fresh plugin manager (entry points loaded) installed for the test.
- ``kf_register_plugin``: ``kf_register_plugin(module_or_object, name="x")`` registers a plugin for
  the duration of the test.
- ``kf_problem``: ``kf_problem(source, name="p")`` writes a KernelBench-format problem file and
  returns its path.
- ``kf_config``: ``kf_config({"search": {"name": "ga"}}, "budget.generations=2")`` returns a
  validated :class:`RunConfig`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kfoundry.core import plugins as plugins_module
from kfoundry.core.config import RunConfig, load_config
from kfoundry.core.plugins import PluginManager

VECTOR_ADD_PROBLEM = """
import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.rand(N), torch.rand(N)]


def get_init_inputs():
    return []
"""


@pytest.fixture
def kf_plugin_manager(monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginManager]:
    """A fresh plugin manager with entry points loaded, used by everything during the test."""
    manager = PluginManager()
    manager.load_entry_points()
    monkeypatch.setattr(plugins_module, "_manager", manager)
    yield manager


@pytest.fixture
def kf_register_plugin(kf_plugin_manager: PluginManager) -> Iterator[Callable[..., PluginManager]]:
    """Register a plugin object for this test only; returns the manager."""
    added: list[str] = []

    def register(plugin: Any, name: str | None = None) -> PluginManager:
        plugin_name: str = name or str(getattr(plugin, "__name__", f"test-plugin-{len(added)}"))
        if not kf_plugin_manager.add_plugin(plugin, plugin_name, package="(test)", version="0"):
            raise RuntimeError(f"plugin {plugin_name} was rejected: {kf_plugin_manager.skipped[-1]}")
        added.append(plugin_name)
        return kf_plugin_manager

    yield register
    for name in added:
        kf_plugin_manager.remove_plugin(name)


@pytest.fixture
def kf_problem(tmp_path: Path) -> Callable[..., Path]:
    """Write a KernelBench-format problem file (default: vector add of 4096 floats)."""

    def make(source: str = VECTOR_ADD_PROBLEM, name: str = "problem") -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        return path

    return make


@pytest.fixture
def kf_config(kf_plugin_manager: PluginManager, tmp_path: Path) -> Callable[..., RunConfig]:
    """Build a validated run config from a dict and ``KEY=VALUE`` overrides (output in tmp_path)."""

    def make(data: dict[str, Any] | None = None, *overrides: str) -> RunConfig:
        merged = {"output_dir": str(tmp_path / "runs"), **(data or {})}
        return load_config(data=merged, overrides=list(overrides), manager=kf_plugin_manager)

    return make
