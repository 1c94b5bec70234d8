"""The language registry: bundled languages, a language and backend from an outside package (entry
points alone), one-line errors for unknown languages, descriptors without the offline plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfoundry import hookimpl
from kfoundry.core.commands.eval import read_candidate
from kfoundry.core.errors import CandidateError, KfError
from kfoundry.core.languages import (
    LanguageSpec,
    UnknownLanguage,
    export_suffix,
    fence_names,
    get_language,
    known_languages,
    language_for_suffix,
)
from kfoundry.core.plugins import PluginManager

# A third-party language: the kernel source is numpy statements over ``args`` (the kernel's
# arguments as arrays sharing the tensors' memory); its backend runs them on the host.
EXT_PLUGIN = """
import numpy as np

from kfoundry import hookimpl
from kfoundry.core.backend import Backend, BackendCapabilities, BackendOptions, CompileFailed, KernelModule
from kfoundry.core.languages import LanguageSpec
from kfoundry.core.models import DeviceProfile

NUMEXPR = LanguageSpec(name="numexpr", suffixes=(".nx",), fences=("numexpr",), description="numpy statements")


class NumexprBackend(Backend):
    name = "numexpr"
    language = "numexpr"

    def capabilities(self):
        return BackendCapabilities(can_compile=True, can_run=True)

    def devices(self):
        return [DeviceProfile(backend="numexpr", name="numpy on the host", device_type="cpu")]

    def toolchain_version(self):
        return f"numpy {np.__version__}"

    def load(self, source, *, defines=None, build_options=None):
        try:
            code = compile(source, "<numexpr kernel>", "exec")
        except SyntaxError as exc:
            raise CompileFailed(f"numexpr: line {exc.lineno}: {exc.msg}", log=str(exc)) from None

        def kernel(*args, grid, block=None, shared_mem=0):
            arrays = [a.numpy() if hasattr(a, "numpy") else a for a in args]
            exec(code, {"np": np, "args": arrays, **(defines or {})})

        return KernelModule({"kernel": kernel})

    def synchronize(self):
        pass


@hookimpl
def kf_register_languages(register):
    register(NUMEXPR.name, NUMEXPR)


@hookimpl
def kf_register_backends(register):
    register("numexpr", NumexprBackend, options=BackendOptions, description="numpy statements on the host")
"""

EXT_PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "kf-numexpr-demo"
version = "0.2.0"

[tool.setuptools]
py-modules = ["kf_numexpr"]

[project.entry-points.kfoundry]
numexpr = "kf_numexpr"
"""

TASK = """
name = "vector_add_numexpr"
language = "numexpr"
kernel_name = "kernel"
kernel_source = "vadd.nx"
reference = "vadd_ref.py:reference"

[sizes]
N = 4096

[[args]]
name = "a"
kind = "input"
shape = ["N"]

[[args]]
name = "b"
kind = "input"
shape = ["N"]

[[args]]
name = "c"
kind = "output"
shape = ["N"]

[launch]
grid = [1]
"""


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(site with the outside package installed, folder with a task and a kernel in its language)."""
    src = tmp_path_factory.mktemp("nx_src")
    (src / "pyproject.toml").write_text(EXT_PYPROJECT)
    (src / "kf_numexpr.py").write_text(EXT_PLUGIN)
    site = tmp_path_factory.mktemp("nx_site")
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
    work = tmp_path_factory.mktemp("nx_task")
    (work / "task.toml").write_text(TASK)
    (work / "vadd.nx").write_text("args[2][:] = args[0] + args[1]\n")
    (work / "wrong.nx").write_text("args[2][:] = args[0] - args[1]\n")
    (work / "vadd_ref.py").write_text("def reference(a, b):\n    return a + b\n")
    return site, work


def _kf_run(site: Path | None, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KF_LOAD_PLUGINS", "KF_DISABLE_PLUGINS")}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-c", "from kfoundry.core.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=cwd,
    )


@pytest.mark.slow  # two sandboxed evaluations through kf-run: about 40 s here
def test_an_outside_package_adds_a_language_and_kf_run_eval_judges_it(ext: tuple[Path, Path]) -> None:
    site, work = ext
    result = _kf_run(
        site,
        work,
        "eval",
        "task.toml",
        "vadd.nx",
        "wrong.nx",
        "--backend",
        "numexpr",
        "--json",
        "--set",
        f"output_dir={json.dumps(str(work / 'out'))}",
        "--set",
        "evaluation.shape_variants=0",
    )
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]  # one of the two is wrong
    right, wrong = json.loads(result.stdout)
    assert right["outcome"] == "correct" and right["backend"] == "numexpr", right["message"]
    assert right["device"] == "numexpr:numpy on the host" and right["timing"]["n"] >= 3
    assert wrong["outcome"] == "mismatch"


def test_without_the_package_the_language_is_unknown_in_one_line(ext: tuple[Path, Path]) -> None:
    _, work = ext
    result = _kf_run(None, work, "eval", "task.toml", "vadd.nx")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "language: unknown kernel language 'numexpr' (known: cuda, hip, opencl, sycl, triton" in lines[0]
    assert "task.toml" in lines[0] and "Traceback" not in result.stderr


def test_bundled_languages_come_from_their_backends() -> None:
    assert {"opencl", "cuda", "hip", "sycl", "triton"} <= set(known_languages())
    assert (
        export_suffix("opencl") == ".cl"
        and export_suffix("cuda") == ".cu"
        and export_suffix("triton") == ".py"
    )
    assert language_for_suffix(".sycl").name == "sycl" and language_for_suffix(".hip").name == "hip"
    assert {"cuda", "cl", "hip", "sycl"} <= fence_names() and "python" not in fence_names()
    assert get_language("triton").candidate_kind == "python"
    with pytest.raises(UnknownLanguage, match=r"unknown kernel language 'metal' \(known: cuda, hip, opencl"):
        get_language("metal")
    with pytest.raises(UnknownLanguage, match=r"no kernel language has file suffix '\.metal'"):
        language_for_suffix(".metal")


def test_a_language_registered_in_process(kf_register_plugin) -> None:  # type: ignore[no-untyped-def]
    class _Metal:
        @hookimpl
        def kf_register_languages(self, register):  # type: ignore[no-untyped-def]
            register("metal", LanguageSpec(name="metal", suffixes=(".metal",), fences=("metal", "msl")))

    manager = kf_register_plugin(_Metal(), name="metal-lang")
    assert get_language("metal", manager).export_suffix == ".metal"
    assert language_for_suffix(".metal", manager).name == "metal"
    assert {"metal", "msl"} <= fence_names(manager)
    manager.remove_plugin("metal-lang")
    assert "metal" not in known_languages(manager)


def test_a_language_plugin_brings_its_prompt_template(kf_register_plugin, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from kfoundry.core import plugins
    from kfoundry.core.generator import GenerationRequest, ProblemSummary
    from kfoundry.core.llm.prompts import PromptBuilder
    from kfoundry.core.models import DeviceProfile

    template = (
        '{% extends "base.j2" %}{% block language_guide %}Metal kernels are MSL functions.{% endblock %}'
    )

    class _Metal:
        @hookimpl
        def kf_register_languages(self, register):  # type: ignore[no-untyped-def]
            register("metal", LanguageSpec(name="metal", suffixes=(".metal",), prompt_template=template))
            register("bare", LanguageSpec(name="bare", suffixes=(".bare",)))

    manager = kf_register_plugin(_Metal(), name="metal-lang")
    monkeypatch.setattr(plugins, "_manager", manager)  # the prompt builder asks the process-wide registry
    device = DeviceProfile(backend="metal", name="M9")
    problem = ProblemSummary(name="vadd", reference_source="class Model: ...")
    prompt = PromptBuilder().generation(GenerationRequest(problem=problem, language="metal", device=device))
    assert "Metal kernels are MSL functions." in prompt.user and "METAL kernel for `vadd`" in prompt.user
    with pytest.raises(KfError, match="no prompt for kernel language 'bare'"):
        PromptBuilder().generation(GenerationRequest(problem=problem, language="bare", device=device))


def test_a_bad_language_spec_is_refused_in_one_line() -> None:
    with pytest.raises(KfError, match="language name 'Metal Lang'"):
        LanguageSpec(name="Metal Lang", suffixes=(".m",))
    with pytest.raises(KfError, match="suffixes"):
        LanguageSpec(name="metal", suffixes=("metal",))


def test_read_candidate_names_languages_by_the_registry(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k() {}\n')
    (tmp_path / "softmax_triton.py").write_text("class ModelNew: pass\n")
    (tmp_path / "plain.py").write_text("class ModelNew: pass\n")
    (tmp_path / "k.metal").write_text("kernel void k() {}\n")
    assert read_candidate(tmp_path / "k.cu").language == "cuda"
    assert read_candidate(tmp_path / "softmax_triton.py").language == "triton"
    assert read_candidate(tmp_path / "plain.py", language="triton").language == "triton"
    assert read_candidate(tmp_path / "plain.py").language == "opencl"
    with pytest.raises(
        CandidateError, match=r"k\.metal: unknown candidate type: no kernel language has file suffix"
    ):
        read_candidate(tmp_path / "k.metal")


def test_languages_and_cuda_descriptors_survive_without_the_offline_plugin(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A user who wants only language models: every backend's language and descriptors stay."""
    from kfoundry.core.descriptors import get_extractor

    monkeypatch.setenv("KF_DISABLE_PLUGINS", "offline")
    manager = PluginManager()
    manager.load_entry_points()
    assert "offline" not in manager.infos
    assert {"cuda", "opencl", "triton"} <= set(known_languages(manager))
    cuda = get_extractor("cuda", manager)
    shared_barrier_shuffle = """
extern "C" __global__ void k(const float* __restrict__ x, float* y, int n) {
    __shared__ float tile[256];
    tile[threadIdx.x] = x[blockIdx.x * 256 + threadIdx.x];
    __syncthreads();
    float v = tile[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    if (threadIdx.x == 0) y[blockIdx.x] = v;
}
"""
    assert cuda.cell(shared_barrier_shuffle) == (2, 0, 3)  # issue 15: (0, 0, 0) when offline owned them
    assert get_extractor("triton", manager).language == "triton"
