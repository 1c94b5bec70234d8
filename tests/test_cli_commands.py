"""kf_register_commands (plugins add kf-run subcommands), --shape sets, runs/show/export input errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kfoundry import hookimpl
from kfoundry.core import hooks
from kfoundry.core.cli import cli, main
from kfoundry.core.commands.optimize import parse_shape_sets
from kfoundry.core.errors import ConfigError
from kfoundry.core.plugins import PluginWarning

ROOT = Path(__file__).parents[1]


class _Hello:
    @hookimpl
    def kf_register_commands(self, cli: click.Group) -> None:
        @cli.command("hello")
        @click.argument("name")
        def hello(name: str) -> None:
            """Say hello."""
            click.echo(f"hello {name}")


class _Hijacker:
    @hookimpl
    def kf_register_commands(self, cli: click.Group) -> None:
        cli.add_command(click.Command("eval", callback=lambda: None))


class _Broken:
    @hookimpl
    def kf_register_commands(self, cli: click.Group) -> None:
        raise RuntimeError("boom")


def _group() -> click.Group:
    group = click.Group("kf-run")
    group.add_command(click.Command("eval", callback=lambda: None))
    return group


def test_a_plugin_adds_a_command(kf_register_plugin) -> None:  # type: ignore[no-untyped-def]
    manager = kf_register_plugin(_Hello(), name="hello")
    group = _group()
    added = hooks.register_commands(group, manager)
    assert "hello" in added and {"report", "export"} <= set(added)  # kfoundry's own command plugins too
    result = CliRunner().invoke(group, ["hello", "world"])
    assert result.exit_code == 0 and result.output == "hello world\n"


def test_a_plugin_cannot_replace_a_command_and_a_broken_one_costs_a_warning(kf_register_plugin) -> None:  # type: ignore[no-untyped-def]
    kf_register_plugin(_Hijacker(), name="hijacker")
    manager = kf_register_plugin(_Broken(), name="broken")
    group = _group()
    original = group.commands["eval"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        added = hooks.register_commands(group, manager)
    assert "eval" not in added
    assert group.commands["eval"] is original
    messages = [str(w.message) for w in caught if issubclass(w.category, PluginWarning)]
    assert any("'broken' could not add commands: RuntimeError: boom" in m for m in messages)
    assert any("tried to replace the kf-run command 'eval'" in m for m in messages)


def test_report_and_export_come_from_the_command_hook() -> None:
    from kfoundry.core.plugins import get_plugin_manager

    manager = get_plugin_manager()
    assert {"report", "export"} <= set(manager.infos)
    assert "kf_register_commands" in manager.infos["report"].hooks
    assert {"report", "export", "runs", "show"} <= set(cli.commands)


def test_shape_values_make_shape_sets() -> None:
    assert parse_shape_sets(()) == []
    assert parse_shape_sets(("dim=256",)) == [{"dim": 256}]
    assert parse_shape_sets(("dim=256,4096", "batch_size=8")) == [
        {"dim": 256, "batch_size": 8},
        {"dim": 4096, "batch_size": 8},
    ]
    assert parse_shape_sets(("dim=256", "dim=4096", "eps=1e-5")) == [
        {"dim": 256, "eps": 1e-5},
        {"dim": 4096, "eps": 1e-5},
    ]
    with pytest.raises(ConfigError, match="expected NAME=VALUE"):
        parse_shape_sets(("dim",))


@pytest.mark.parametrize(
    "args, message",
    [
        (["runs", "/nonexistent/kf-runs"], "runs folder not found: /nonexistent/kf-runs"),
        (["show", "/nonexistent/run"], "/nonexistent/run: not a kfoundry run folder (no run.json)"),
        (["report", "/nonexistent/run"], "/nonexistent/run: not a kfoundry run folder (no run.json)"),
        (
            ["export", "/nonexistent/run", "--to", "/tmp/kf_pkg"],
            "/nonexistent/run: not a kfoundry run folder",
        ),
        (
            ["examples/kernelbench/softmax.py", "--shape", "dim=abc"],
            "--shape 'dim=abc': value is not a number",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    code, _, err = _main(args, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and message in err, err


def test_runs_lists_nothing_in_an_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(["runs", str(tmp_path), "--json"], capsys)
    assert code == 0 and out.strip() == "[]"


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``kf-run ARGS`` in this process: exit status, stdout, stderr."""
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
