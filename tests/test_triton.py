"""The Triton backend, a language added through the registry: its descriptors, prompt, offline recipes
(run for real in Triton's interpreter), and kf-run judging and searching with it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kfoundry.core.generator import GenerationRequest, GeneratorUnsupported, ProblemSummary
from kfoundry.core.languages import get_language
from kfoundry.core.llm.prompts import PromptBuilder
from kfoundry.core.models import Candidate
from kfoundry.core.problem import load_problem
from kfoundry.plugins.backends.triton.backend import INTERPRETER_DEVICE, TritonBackend
from kfoundry.plugins.backends.triton.descriptors import strip_python_comments, triton_descriptors
from kfoundry.plugins.backends.triton.options import TritonOptions
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.triton_expr import triton_expr

# triton itself is imported only once the backend has set TRITON_INTERPRET=1 (its library functions
# are decorated at import): no module-level import here
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

ROOT = Path(__file__).parents[1]
KB = ROOT / "examples" / "kernelbench"

SOFTMAX = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLE = {"BLOCK": [256, 512, 1024]}
BLOCK = PARAMS.get("BLOCK", 512)


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    """One program per row; the row in BLOCK-wide pieces (tl.dot in a docstring does not count)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):  # the row's maximum, lane-wise
        mask = start + cols < n_cols
        m = tl.maximum(m, tl.load(x_ptr + row * stride + start + cols, mask=mask, other=float("-inf")))
    row_max = tl.max(m, axis=0)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * stride + start + cols, mask=mask, other=float("-inf"))
        s += tl.where(mask, tl.exp(x - row_max), 0.0)
    total = tl.sum(s, axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * stride + start + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride + start + cols, tl.exp(x - row_max) / total, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        softmax_rows[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=BLOCK, num_warps=4)
        return y
'''


@pytest.fixture(scope="session")
def backend() -> Iterator[TritonBackend]:
    before = os.environ.get("TRITON_INTERPRET")
    b = TritonBackend(TritonOptions(mode="interpret"))  # sets TRITON_INTERPRET=1 (read by @triton.jit)
    b.select_device(None)
    yield b
    if before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = before


def test_the_language_is_registered_by_the_backend_plugin() -> None:
    spec = get_language("triton")
    assert spec.candidate_kind == "python" and spec.export_suffix == ".py"
    assert {"triton", "triton.language"} <= set(spec.allowed_imports)
    assert '{% extends "base.j2" %}' in spec.prompt_template


def test_interpreter_device_says_times_are_not_representative(backend: TritonBackend) -> None:
    assert backend.interpret and backend.torch_device == "cpu"
    (device,) = backend.devices()
    assert device.name == INTERPRETER_DEVICE and device.extra["times_representative"] is False
    assert "not representative" in backend.toolchain_version()
    caps = backend.capabilities()
    assert caps.can_run and "correctness only" in caps.reason


def test_a_candidate_runs_in_the_interpreter_and_its_launches_are_counted(backend: TritonBackend) -> None:
    problem = load_problem(KB / "softmax.py", {"batch_size": 3, "dim": 700})
    model = problem.build_candidate(Candidate(source=SOFTMAX, language="triton"), None)
    (x,) = problem.make_inputs(0)
    before = backend.launch_count
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's exp(-inf - -inf) in masked lanes
        y = model(x)
    assert backend.launch_count == before + 1
    torch.testing.assert_close(y, torch.softmax(x, dim=1))


def test_descriptors_read_python_not_its_comments() -> None:
    stripped = strip_python_comments('x = a // 2  # tl.dot(\n"""tl.atomic_add("""\ny = tl.dot(a, b)\n')
    assert "x = a // 2" in stripped and "tl.dot(a, b)" in stripped and "atomic" not in stripped
    extractor = triton_descriptors()
    assert extractor.cell(SOFTMAX) == (1, 0, 1)  # masked loads, multi-pass, block reductions
    matmul = "acc += tl.dot(a, b)\nfor k in range(0, K, BLOCK_K):\n    a = tl.load(a_ptrs, mask=m)\n"
    tiled = (
        matmul
        + "tl.atomic_add(c, v)\nb_ptrs = tl.make_block_ptr(b, (K, N), (N, 1), (0, 0), (BK, BN), (1, 0))\n"
    )
    assert extractor.cell(matmul) == (1, 3, 0)
    assert extractor.cell(tiled) == (2, 3, 3)


def test_c_expressions_become_triton() -> None:
    assert (
        triton_expr("((v0) < 0.0f ? 0.01f * (v0) : (v0))") == "(tl.where(((v0) < 0.0), (0.01 * (v0)), (v0)))"
    )
    assert triton_expr("(1.0f / (1.0f + expf(-(v0))))") == "((1.0 / ((1.0 + tl.exp((-(v0)))))))"
    assert "tl.erf" in triton_expr("(0.5f * (v0) * (1.0f + erff((v0) * 0.7071f)))")
    with pytest.raises(GeneratorUnsupported, match="no Triton form of frexpf"):
        triton_expr("frexpf(v0)")
    with pytest.raises(GeneratorUnsupported):
        triton_expr("v0 ? v1")


LINEAR_RELU = """
import torch
import torch.nn as nn

batch = 33
fin = 40
fout = 24


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(fin, fout)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(batch, fin)]


def get_init_inputs():
    return []
"""

CASES = {
    "matmul": {"M": 40, "K": 50, "N": 30},
    "linear_relu": {},
    "softmax": {"batch_size": 3, "dim": 300},
    "layer_norm": {"batch_size": 3, "features": 300},
    "rms_norm": {"batch_size": 3, "features": 300},
    "sum_reduction": {"batch_size": 2, "dim1": 37, "dim2": 5},
    "gelu": {"N": 3000},
    "vector_add": {"N": 3000},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_offline_triton_recipes_are_correct_in_the_interpreter(
    name: str, backend: TritonBackend, tmp_path: Path
) -> None:
    path = KB / f"{name}.py"
    if name == "linear_relu":  # nn.Linear (bias, the weight read transposed) with a fused epilogue
        path = tmp_path / "linear_relu.py"
        path.write_text(LINEAR_RELU)
    problem = load_problem(path, CASES[name])
    recipes = OfflineGenerator().recipes(problem.summary(), "triton")
    assert recipes[0].rank == 0 and len(recipes) >= 2
    extractor = triton_descriptors()
    cells = set()
    for recipe in recipes:
        cand = recipe.candidate()
        assert cand.language == "triton" and "@triton.jit" in cand.source
        model = problem.build_candidate(cand, None)
        inputs = problem.make_inputs(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = model(*inputs)
        torch.testing.assert_close(got, problem.make_reference()(*inputs), rtol=1e-4, atol=1e-5)
        cells.add(extractor.cell(cand.source))
    assert len(cells) >= 2, "the ladder spreads over the archive"


def test_the_offline_generator_says_which_families_have_triton_recipes() -> None:
    problem = load_problem(KB / "depthwise_conv2d.py", {})
    with pytest.raises(GeneratorUnsupported, match="no Triton recipes for the depthwise_conv2d family"):
        OfflineGenerator().recipes(problem.summary(), "triton")


def test_the_prompt_teaches_triton(backend: TritonBackend) -> None:
    from kfoundry.core.models import DeviceProfile

    device = backend.devices()[0]
    assert isinstance(device, DeviceProfile)
    summary = ProblemSummary(name="softmax", reference_source="class Model: ...", input_shapes=[[8, 64]])
    prompt = PromptBuilder().generation(GenerationRequest(problem=summary, language="triton", device=device))
    assert "@triton.jit" in prompt.user and "kernel[grid]" in prompt.user
    assert "kfoundry.runtime.load" not in prompt.user  # the C-kernel guide is replaced
    assert "times are not representative" in prompt.user


def _kf_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KF_LOAD_PLUGINS", "KF_DISABLE_PLUGINS")}
    return subprocess.run(
        [sys.executable, "-c", "from kfoundry.core.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=cwd,
    )


FAST = [
    "--set",
    "evaluation.shape_variants=0",
    "--set",
    "evaluation.trials=2",
    "--set",
    "evaluation.min_repeats=3",
]


@pytest.mark.slow  # a sandboxed evaluation in Triton's interpreter
def test_kf_run_eval_judges_a_triton_candidate(tmp_path: Path) -> None:
    (tmp_path / "softmax_triton.py").write_text(SOFTMAX)
    result = _kf_run(
        "eval", str(KB / "softmax.py"), "softmax_triton.py", "--backend", "triton", "--json",
        "--shape", "batch_size=4", "--shape", "dim=1000", "--set", f"output_dir={json.dumps(str(tmp_path))}",
        *FAST, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads(result.stdout)
    assert record["outcome"] == "correct"
    assert "not representative" in record["toolchain"] and "not representative" in record["device"]


@pytest.mark.slow  # a short offline search, every candidate judged in the interpreter
def test_kf_run_finds_a_correct_triton_softmax(tmp_path: Path) -> None:
    result = _kf_run(
        str(KB / "softmax.py"), "--set", 'backend.name="triton"', "--shape", "batch_size=4", "--shape", "dim=512",
        "--set", "budget.generations=2", "--set", "budget.proposals_per_generation=3", "--set", "tuner.every=-1",
        "--set", f"output_dir={json.dumps(str(tmp_path / 'runs'))}", "--json", *FAST, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout)
    best = summary["best"]
    assert best is not None and best["outcome"] == "correct", json.dumps(summary)[:2000]
    assert best["label"].startswith("triton/rows/"), best
