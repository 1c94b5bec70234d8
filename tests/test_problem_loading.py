"""Problems: KernelBench files and native tasks load, report their sizes, and fail in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from eval_helpers import EXAMPLES, SMALL_SHAPES

from kfoundry.core.errors import ProblemError
from kfoundry.core.models import Candidate
from kfoundry.core.problem import load_problem, parse_shape_overrides


@pytest.mark.parametrize("name", sorted(SMALL_SHAPES))
def test_every_example_loads_with_small_shapes(name: str) -> None:
    problem = load_problem(EXAMPLES / "kernelbench" / f"{name}.py", SMALL_SHAPES[name])
    assert problem.format == "kernelbench"
    for key, value in SMALL_SHAPES[name].items():
        assert problem.shapes[key] == value
    summary = problem.summary()
    assert summary.name == name and summary.output_shapes and summary.bytes_moved > 0
    inputs = problem.make_inputs(3)
    assert all(float(t.abs().sum()) > 0 for t in inputs if isinstance(t, torch.Tensor))


def test_bytes_and_flops_are_counted_from_the_reference() -> None:
    problem = load_problem(EXAMPLES / "kernelbench" / "matmul.py", {"M": 40, "K": 48, "N": 36})
    assert problem.flops == 2 * 40 * 48 * 36
    assert problem.bytes_moved == 4 * (40 * 48 + 48 * 36 + 40 * 36)
    vec = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 1000})
    assert vec.bytes_moved == 3 * 4 * 1000 and vec.flops == 0


def test_inputs_are_fresh_per_seed_and_reproducible() -> None:
    problem = load_problem(EXAMPLES / "kernelbench" / "softmax.py", SMALL_SHAPES["softmax"])
    a, b, a2 = problem.make_inputs(1)[0], problem.make_inputs(2)[0], problem.make_inputs(1)[0]
    assert not torch.equal(a, b) and torch.equal(a, a2)


def test_problem_key_changes_with_shapes() -> None:
    path = EXAMPLES / "kernelbench" / "gelu.py"
    assert load_problem(path, {"N": 64}).key != load_problem(path, {"N": 128}).key


def test_shape_override_parsing() -> None:
    assert parse_shape_overrides(["N=8", "eps=1e-3"]) == {"N": 8, "eps": 1e-3}
    with pytest.raises(ProblemError, match="expected NAME=VALUE"):
        parse_shape_overrides(["N"])
    with pytest.raises(ProblemError, match="not a number"):
        parse_shape_overrides(["N=big"])


MALFORMED = {
    "syntax": ("import torch\nclass Model(:\n    pass\n", "syntax error"),
    "no_model": ("import torch\ndef get_inputs():\n    return []\n", "no Model class"),
    "no_inputs": (
        "import torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n",
        "no get_inputs",
    ),
    "raises": ("raise ValueError('boom')\n", "error while loading: ValueError: boom"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_problem_is_one_line_error(tmp_path: Path, case: str) -> None:
    source, expected = MALFORMED[case]
    path = tmp_path / f"{case}.py"
    path.write_text(source)
    with pytest.raises(ProblemError, match=expected) as info:
        load_problem(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_unknown_shape_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProblemError, match="unknown shape constant 'batch'"):
        load_problem(EXAMPLES / "kernelbench" / "softmax.py", {"batch": 2})
    with pytest.raises(ProblemError, match="not found"):
        load_problem(tmp_path / "missing.py")
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(ProblemError, match="KernelBench .py file or a native task .toml"):
        load_problem(tmp_path / "x.txt")


def test_native_task_loads_with_space_and_sizes() -> None:
    problem = load_problem(EXAMPLES / "native" / "matmul.toml", {"M": 16, "N": 8, "K": 4})
    assert problem.format == "native" and problem.language == "opencl"
    assert problem.space is not None and problem.space.params["WPT"] == [1, 2, 4]
    assert problem.space.restrictions == ["BLOCK_X * BLOCK_Y <= max_work_group_size"]
    assert problem.summary().output_shapes == [[16, 8]]
    assert problem.flops == 2 * 16 * 8 * 4
    cand = Candidate(source=problem.source, kind="native", params={"WPT": 2})
    assert problem.candidate_params(cand) == {"BLOCK_X": 4, "BLOCK_Y": 1, "WPT": 2}


NATIVE_BASE = """
name = "t"
kernel_name = "k"
reference = "ref.py:f"
[sizes]
N = 8
[[args]]
name = "y"
kind = "output"
shape = ["N"]
[launch]
grid = ["N"]
"""


@pytest.mark.parametrize(
    ("text", "ref", "expected"),
    [
        (NATIVE_BASE, "def f():\n    pass\n", None),
        (NATIVE_BASE.replace('kernel_name = "k"\n', ""), "def f(): pass\n", "kernel_name: Field required"),
        (NATIVE_BASE, "def g(): pass\n", "no function 'f'"),
        (NATIVE_BASE.replace('kind = "output"', 'kind = "result"'), "def f(): pass\n", "args.0.kind"),
        (NATIVE_BASE + "bogus = 1\n", "def f(): pass\n", "launch.bogus"),
        ("name = [", "def f(): pass\n", "Expected|expected|Invalid|invalid"),
    ],
)
def test_native_task_errors(tmp_path: Path, text: str, ref: str, expected: str | None) -> None:
    (tmp_path / "ref.py").write_text(ref)
    path = tmp_path / "task.toml"
    path.write_text(text)
    if expected is None:
        assert load_problem(path).name == "t"
        return
    with pytest.raises(ProblemError, match=expected):
        load_problem(path)


def test_a_reference_that_cannot_run_on_meta_is_not_drawn_for_real_at_any_size(tmp_path: Path) -> None:
    """Without a limit from the caller, the real-draw fallback of ``analysis`` stops at a quarter of this
    machine's memory: a huge problem is refused in one line instead of allocating it."""
    path = tmp_path / "huge_nonmeta.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\nN = 2**40\n\n"
        "class Model(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * float(x.sum().item())  # .item() cannot run on the meta device\n\n"
        "def get_inputs():\n    return [torch.rand(N)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    problem = load_problem(path)
    with pytest.raises(ProblemError, match="not drawn for real beyond"):
        problem.analysis()
    small = load_problem(path, {"N": 64})  # small enough: drawn for real, analysed
    assert small.analysis().input_shapes == [[64]]
