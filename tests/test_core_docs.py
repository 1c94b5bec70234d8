"""docs/config.md (from the models and registered plugins) and docs/hooks.md (from the hook specs)
are generated; neither may be stale."""

from __future__ import annotations

from pathlib import Path

from kfoundry.core.docgen import render, render_hooks
from kfoundry.core.plugins import PluginManager

ROOT = Path(__file__).parents[1]


def test_config_reference_is_current() -> None:
    manager = PluginManager()
    manager.load_entry_points()
    expected = render(manager)
    actual = (ROOT / "docs" / "config.md").read_text()
    assert actual == expected, (
        "docs/config.md is stale: run `python -m kfoundry.core.docgen > docs/config.md`"
    )


def test_config_reference_covers_every_section() -> None:
    text = (ROOT / "docs" / "config.md").read_text()
    for key in ("`budget.generations`", "`evaluation.timeout_s`", "`backend.device`", "`ensemble.mode`"):
        assert key in text


def test_hook_reference_is_current() -> None:
    actual = (ROOT / "docs" / "hooks.md").read_text()
    assert actual == render_hooks(), (
        "docs/hooks.md is stale: run `python -m kfoundry.core.docgen hooks > docs/hooks.md`"
    )


def test_hook_reference_lists_parameters_as_markdown() -> None:
    text = render_hooks()
    assert "def kf_run_finished(run_id: str, summary: RunSummary) -> None: ..." in text
    assert "- `summary`: How it ended" in text and "- returns: Reasons to reject it" in text
    assert ":param" not in text and ":class:" not in text and "``" not in text.replace("```", "")
