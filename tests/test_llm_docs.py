"""Every TOML example in docs/llm-providers.md is a valid run config (the docs cannot rot)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from kfoundry.core.config import load_config
from kfoundry.core.plugins import PluginManager

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DOC = Path(__file__).parents[1] / "docs" / "llm-providers.md"
BLOCKS = re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_page_has_examples_for_every_provider() -> None:
    text = "\n".join(BLOCKS)
    for name in ('name = "openai"', 'name = "anthropic"', 'name = "replay"', 'base_url = "http://127.0.0.1'):
        assert name in text


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_toml_example_is_a_valid_config(block: str, kf_plugin_manager: PluginManager) -> None:
    data = tomllib.loads(block)
    if "llms" not in data:  # a fragment of a member's options
        pytest.fail("every example should be a complete [[llms]] entry")
    config = load_config(data=data, manager=kf_plugin_manager)
    assert config.llms
