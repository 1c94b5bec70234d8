"""docs/config.md is generated from the models and registered plugins; it must not be stale."""

from __future__ import annotations

from pathlib import Path

from kfoundry.core.docgen import render
from kfoundry.core.plugins import PluginManager

ROOT = Path(__file__).parents[1]


def test_config_reference_is_current() -> None:
    manager = PluginManager()
    manager.load_entry_points()
    expected = render(manager)
    actual = (ROOT / "docs" / "config.md").read_text()
    assert actual == expected, "docs/config.md is stale: run `python -m kfoundry.core.docgen > docs/config.md`"


def test_config_reference_covers_every_section() -> None:
    text = (ROOT / "docs" / "config.md").read_text()
    for key in ("`budget.generations`", "`evaluation.timeout_s`", "`backend.device`", "`ensemble.mode`"):
        assert key in text
