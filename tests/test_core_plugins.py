"""Plugin loading: entry points from an outside package, env controls, broken plugins, duplicates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfoundry import hookimpl
from kfoundry.core.errors import PluginError
from kfoundry.core.plugins import PluginManager, PluginWarning

EXT_BACKEND = """
from kfoundry import hookimpl
from kfoundry.core.backend import Backend, BackendCapabilities, BackendOptions, KernelModule


class EchoBackend(Backend):
    name = "echo"
    language = "opencl"

    def capabilities(self):
        return BackendCapabilities(can_compile=True, can_run=False, reason="demo backend")

    def devices(self):
        return []

    def toolchain_version(self):
        return "echo 1.0"

    def load(self, source, *, defines=None, build_options=None):
        return KernelModule({})

    def synchronize(self):
        pass


@hookimpl
def kf_register_backends(register):
    register("echo", EchoBackend, options=BackendOptions, description="demo backend")
"""

EXT_PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "kf-ext-demo"
version = "3.1.4"

[tool.setuptools]
py-modules = ["kf_ext_backend", "kf_ext_broken", "kf_ext_badhook"]

[project.entry-points.kfoundry]
extbackend = "kf_ext_backend"
extbroken = "kf_ext_broken"
extbadhook = "kf_ext_badhook"
"""


@pytest.fixture(scope="module")
def ext_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build and install (into a private target dir) a third-party package with three plugins."""
    src = tmp_path_factory.mktemp("ext_src")
    (src / "pyproject.toml").write_text(EXT_PYPROJECT)
    (src / "kf_ext_backend.py").write_text(EXT_BACKEND)
    (src / "kf_ext_broken.py").write_text("import kf_this_module_does_not_exist\n")
    (src / "kf_ext_badhook.py").write_text(
        "from kfoundry import hookimpl\n\n@hookimpl\ndef kf_register_backends(registr):\n    pass\n"
    )
    site = tmp_path_factory.mktemp("ext_site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    return site


def _kf_run(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(site), **env}
    full_env.pop("KF_LOAD_PLUGINS", None) if "KF_LOAD_PLUGINS" not in env else None
    return subprocess.run(
        [sys.executable, "-c", "from kfoundry.core.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def test_outside_package_registers_backend(ext_site: Path) -> None:
    result = _kf_run(ext_site, "plugins", "--json")
    assert result.returncode == 0, result.stderr
    listing = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    ext = listing["extbackend"]
    assert ext["package"] == "kf-ext-demo"
    assert ext["version"] == "3.1.4"
    assert ext["registered"] == {"backend": ["echo"]}
    assert ext["hooks"] == ["kf_register_backends"]


def test_broken_plugins_warn_in_one_line_and_are_skipped(ext_site: Path) -> None:
    result = _kf_run(ext_site, "plugins", "--json")
    assert result.returncode == 0
    names = {p["name"] for p in json.loads(result.stdout)["plugins"]}
    assert "extbroken" not in names and "extbadhook" not in names
    warnings = [line for line in result.stderr.splitlines() if "kf-ext-demo" in line]
    assert any("extbroken" in w and "import failed" in w for w in warnings)
    assert any("extbadhook" in w and "bad hook" in w for w in warnings)
    assert "Traceback" not in result.stderr


def test_disable_plugin_by_environment(ext_site: Path) -> None:
    result = _kf_run(ext_site, "plugins", "--json", KF_DISABLE_PLUGINS="extbackend,extbroken")
    names = {p["name"] for p in json.loads(result.stdout)["plugins"]}
    assert "extbackend" not in names
    assert "extbroken" not in result.stderr


def test_load_only_named_plugins(ext_site: Path) -> None:
    result = _kf_run(ext_site, "plugins", "--json", KF_LOAD_PLUGINS="extbackend")
    names = [p["name"] for p in json.loads(result.stdout)["plugins"]]
    assert names == ["extbackend"]


def test_outside_backend_selectable_in_config(ext_site: Path, tmp_path: Path) -> None:
    config = tmp_path / "kf.toml"
    config.write_text('[backend]\nname = "echo"\n[backend.options]\nbuild_options = ["-O2"]\n')
    result = _kf_run(ext_site, "config", "--config", str(config), "--show")
    assert result.returncode == 0, result.stderr
    assert 'name = "echo"' in result.stdout


class _Dup:
    def __init__(self, label: str) -> None:
        self.label = label

    @hookimpl
    def kf_register_tuners(self, register):  # type: ignore[no-untyped-def]
        register("dup-tuner", lambda options: None)


def test_duplicate_name_names_both_packages() -> None:
    manager = PluginManager()
    manager.add_plugin(_Dup("a"), "first", package="pkg-one", version="1")
    with pytest.raises(PluginError) as info:
        manager.add_plugin(_Dup("b"), "second", package="pkg-two", version="1")
    message = str(info.value)
    assert "dup-tuner" in message and "pkg-one" in message and "pkg-two" in message
    # the failed plugin is fully removed; the first keeps its name
    assert "second" not in manager.infos
    assert manager.get("tuner", "dup-tuner").package == "pkg-one"


def test_bad_hook_signature_in_process_is_a_warning() -> None:
    manager = PluginManager()

    class Bad:
        @hookimpl
        def kf_register_llms(self, reg):  # type: ignore[no-untyped-def]
            pass

    with pytest.warns(PluginWarning, match="bad hook"):
        assert manager.add_plugin(Bad(), "bad", package="pkg-bad") is False
    assert "bad" not in manager.infos


def test_unknown_plugin_lists_known_names(kf_register_plugin) -> None:  # type: ignore[no-untyped-def]
    manager = kf_register_plugin(_Dup("x"), name="dups")
    with pytest.raises(PluginError, match="unknown tuner plugin 'nope'.*dup-tuner"):
        manager.get("tuner", "nope")


def test_register_rejects_non_callable_factory() -> None:
    class Broken:
        @hookimpl
        def kf_register_executors(self, register):  # type: ignore[no-untyped-def]
            register("exec", 42)

    with pytest.raises(PluginError, match="factory is not callable"):
        PluginManager().add_plugin(Broken(), "broken", package="pkg-x")


def test_every_bundled_entry_point_loads() -> None:
    manager = PluginManager()
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("error", PluginWarning)
        manager.load_entry_points()
    assert {"opencl", "offline", "map_elites", "bayesian", "local"} <= set(manager.infos)
    assert "opencl" in manager.registry("backend")


def test_loading_every_bundled_plugin_imports_no_heavy_library() -> None:
    """Every kf-run command loads every plugin: torch and the LLM/optimiser SDKs wait until used."""
    code = (
        "import sys, json\n"
        "from kfoundry.core.plugins import get_plugin_manager\n"
        "pm = get_plugin_manager()\n"
        "heavy = ['torch', 'openai', 'anthropic', 'nevergrad', 'optuna', 'ray']\n"
        "print(json.dumps({'loaded': [m for m in heavy if m in sys.modules], 'skipped': len(pm.skipped)}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"loaded": [], "skipped": 0}
