"""The worked example the OpenCL and SYCL prompts teach really runs: it is judged correct by the real
evaluation pipeline (PoCL; the SYCL backend on Intel's OpenCL CPU device), with the harness's PARAMS
taking effect. The CUDA example compiles for Hopper."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kfoundry.core.generator import GenerationRequest, ProblemSummary
from kfoundry.core.llm.parsing import code_blocks, extract_params, extract_space
from kfoundry.core.llm.prompts import PromptBuilder
from kfoundry.core.models import DeviceProfile

ROOT = Path(__file__).parents[1]

SCALE_ADD = """
import torch
import torch.nn as nn

N = 3000


class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x, y):
        return self.alpha * x + y


def get_inputs():
    return [torch.rand(N), torch.rand(N)]


def get_init_inputs():
    return [1.5]
"""


@pytest.mark.slow
def test_opencl_prompt_example_is_a_correct_candidate(tmp_path: Path) -> None:
    request = GenerationRequest(
        problem=ProblemSummary(name="scale_add", reference_source=SCALE_ADD),
        language="opencl",
        device=DeviceProfile(backend="opencl", name="pocl", device_type="cpu"),
    )
    text = PromptBuilder().generation(request).user
    [example] = [body for lang, body in code_blocks(text) if "class ModelNew" in body]
    assert extract_params(example) == {"BLOCK": 256}
    space = extract_space(example)
    assert space is not None and space.params == {"BLOCK": [64, 128, 256, 512]}
    (tmp_path / "scale_add.py").write_text(SCALE_ADD)
    (tmp_path / "candidate.py").write_text(example)
    code = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
    args = [
        "eval",
        str(tmp_path / "scale_add.py"),
        str(tmp_path / "candidate.py"),
        "--set",
        f"output_dir={tmp_path}",
        "--set",
        "evaluation.trials=2",
        "--set",
        "evaluation.target_time_s=0.02",
        "--params",
        "BLOCK=64",
    ]  # a tuned value, read through the harness's PARAMS
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "correct" in done.stdout


def test_cuda_prompt_example_kernel_compiles_for_hopper() -> None:
    import re

    from kfoundry.core.plugins import get_plugin

    backend = get_plugin("backend", "cuda").build({"compile_only": True, "arch": "sm_90"})
    if not backend.capabilities().can_compile:
        pytest.skip(backend.capabilities().reason)
    request = GenerationRequest(
        problem=ProblemSummary(name="scale_add", reference_source=SCALE_ADD),
        language="cuda",
        device=DeviceProfile(backend="cuda", name="NVIDIA H200", compute_capability="9.0", warp_size=32),
    )
    [example] = [b for _, b in code_blocks(PromptBuilder().generation(request).user) if "class ModelNew" in b]
    source = re.search(r'SRC = r"""(.*?)"""', example, re.DOTALL)
    assert source is not None
    module = backend.load(source.group(1), defines=extract_params(example))
    assert module.kernel_names == ["scale_add"] and module.resources["scale_add"]["spill_stores"] == 0


@pytest.mark.slow
def test_sycl_prompt_example_is_a_correct_candidate(tmp_path: Path) -> None:
    from kfoundry.core.plugins import get_plugin

    caps = get_plugin("backend", "sycl").build({}).capabilities()
    if not caps.can_run:
        pytest.skip(caps.reason)
    request = GenerationRequest(
        problem=ProblemSummary(name="scale_add", reference_source=SCALE_ADD),
        language="sycl",
        device=DeviceProfile(backend="sycl", name="Intel OpenCL CPU", device_type="cpu"),
    )
    [example] = [b for _, b in code_blocks(PromptBuilder().generation(request).user) if "class ModelNew" in b]
    (tmp_path / "scale_add.py").write_text(SCALE_ADD)
    (tmp_path / "candidate_sycl.py").write_text(example)
    code = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
    args = [
        "eval",
        str(tmp_path / "scale_add.py"),
        str(tmp_path / "candidate_sycl.py"),
        "--backend",
        "sycl",
        "--set",
        f"output_dir={tmp_path}",
        "--set",
        "evaluation.trials=2",
        "--set",
        "evaluation.target_time_s=0.02",
        "--params",
        "BLOCK=128",
    ]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "correct" in done.stdout
