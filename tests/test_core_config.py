"""Run config: TOML + overrides, plugin options validation, one-line errors with exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from kfoundry import hookimpl
from kfoundry.core.config import RunConfig, load_config, parse_override
from kfoundry.core.errors import ConfigError


class _StrategyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    islands: int = 4
    exploration: float = 0.2


class _TestStrategies:
    @hookimpl
    def kf_register_search(self, register):  # type: ignore[no-untyped-def]
        register("test-strategy", lambda options: options, options=_StrategyOptions)


@pytest.fixture
def manager(kf_register_plugin):  # type: ignore[no-untyped-def]
    return kf_register_plugin(_TestStrategies(), name="test-strategies")


def test_defaults_are_a_valid_config(kf_config) -> None:  # type: ignore[no-untyped-def]
    config = kf_config()
    assert isinstance(config, RunConfig)
    assert config.backend.name == "opencl" and config.llms[0].name == "offline"


def test_toml_and_overrides(tmp_path: Path, manager) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "kf.toml"
    path.write_text('seed = 3\n[search]\nname = "test-strategy"\n[search.options]\nislands = 2\n')
    config = load_config(path, ["search.options.exploration=0.5", "budget.generations=2"], manager=manager)
    assert config.seed == 3
    assert config.search.options == {"islands": 2, "exploration": 0.5}
    assert config.budget.generations == 2


def test_override_into_llm_list(manager) -> None:  # type: ignore[no-untyped-def]
    config = load_config(overrides=["llms.0.weight=2.5"], manager=manager)
    assert config.llms[0].weight == 2.5


@pytest.mark.parametrize(
    ("data", "overrides", "expected"),
    [
        ({"budgett": {"generations": 2}}, [], "unknown key budgett"),
        ({"budget": {"generatons": 2}}, [], "unknown key budget.generatons"),
        ({}, ["budget.generations=many"], "budget.generations: Input should be a valid integer"),
        ({}, ["search.name=nope"], "search.name: unknown search plugin 'nope'"),
        (
            {"search": {"name": "test-strategy", "options": {"islnds": 3}}},
            [],
            "unknown key search.options.islnds",
        ),
        ({"search": {"name": "test-strategy", "options": {"islands": "x"}}}, [], "search.options.islands"),
        ({"llms": [{"name": "offline", "wieght": 1}]}, [], "unknown key llms[0].wieght"),
    ],
)
def test_bad_config_names_the_key_path(manager, data, overrides, expected) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        load_config(data=data, overrides=overrides, manager=manager)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_override_parsing() -> None:
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=hello world") == (["a"], "hello world")
    assert parse_override('x=["a", "b"]') == (["x"], ["a", "b"])
    with pytest.raises(ConfigError):
        parse_override("novalue")


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[search]\nnmae = "ga"\n', "unknown key search.nmae"),
        ("[budget]\ngenerations = 'lots'\n", "budget.generations"),
        ('[backend]\nname = "no-such-backend"\n', "backend.name: unknown backend plugin 'no-such-backend'"),
        ("[budget\n", "config error in"),
    ],
)
def test_cli_bad_config_exits_2_in_one_line(tmp_path: Path, toml: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    result = subprocess.run(
        [sys.executable, "-c", "from kfoundry.core.cli import main; main()", "config", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert str(path) in errors[0]


def test_cli_debug_shows_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[budget]\ngenerations = 0\n")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from kfoundry.core.cli import main; main()",
            "--debug",
            "config",
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" in result.stderr


def test_config_show_prints_resolved_plugin_defaults(manager, capsys) -> None:  # type: ignore[no-untyped-def]
    from kfoundry.core.cli import main

    main(["config", "--set", "search.name=test-strategy", "--show"])
    out = capsys.readouterr().out
    assert "[search.options]" in out and "islands = 4" in out and "exploration = 0.2" in out


def test_missing_config_file_is_one_line() -> None:
    with pytest.raises(ConfigError, match="config file not found: /nope.toml"):
        load_config("/nope.toml")
