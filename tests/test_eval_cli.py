"""``kf-run eval``: verdict, timing table, speedup; exit 0 / 1 / 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_helpers import BAD, EXAMPLES

from kfoundry.core.cli import main

FAST = [
    "--set",
    "evaluation.target_time_s=0.005",
    "--set",
    "evaluation.warmup_s=0.0",
    "--set",
    "evaluation.rotate_bytes=0",
]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def test_eval_prints_verdict_timing_and_speedup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "eval",
        str(EXAMPLES / "kernelbench" / "softmax.py"),
        str(EXAMPLES / "kernelbench" / "improved" / "softmax_opencl.py"),
        "--shape",
        "batch_size=4",
        "--shape",
        "dim=64",
        "--set",
        f"output_dir={tmp_path}",
        *FAST,
    ]
    code, out, _ = _run(args, capsys)
    assert code == 0, out
    assert (
        "correct" in out and "candidate" in out and "reference" in out and "speedup over the reference" in out
    )
    code, out, _ = _run([*args, "--json"], capsys)
    record = json.loads(out)
    assert code == 0 and record["outcome"] == "correct" and record["cached"] is True and record["speedup"] > 0


def test_eval_native_with_params(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "eval",
        str(EXAMPLES / "native" / "vector_add.toml"),
        str(EXAMPLES / "native" / "vector_add.cl"),
        "--shape",
        "N=999",
        "--params",
        "BLOCK=64",
        "--params",
        "VEC=2",
        "--no-cache",
        "--json",
        "--set",
        f"output_dir={tmp_path}",
        *FAST,
    ]
    code, out, _ = _run(args, capsys)
    assert code == 0 and json.loads(out)["outcome"] == "correct"


def test_incorrect_candidate_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "eval",
        str(EXAMPLES / "kernelbench" / "vector_add.py"),
        str(BAD / "off_by_one.py"),
        "--shape",
        "N=300",
        "--set",
        f"output_dir={tmp_path}",
        *FAST,
    ]
    code, out, _ = _run(args, capsys)
    assert code == 1 and "mismatch: trial 0: output 0:" in out


@pytest.mark.parametrize(
    ("problem_source", "extra", "message"),
    [
        ("import torch\nclass Model(:\n", [], "syntax error"),
        ("import torch\n", [], "no Model class"),
        ("import torch.nn as nn\nclass Model(nn.Module):\n    pass\n", [], "no get_inputs"),
        (None, ["--shape", "nope=3"], "unknown shape constant 'nope'"),
        (None, ["--backend", "nonexistent"], "unknown backend plugin 'nonexistent'"),
        (None, ["--set", "executor.options.workerz=2"], "unknown key executor.options.workerz"),
        (None, ["--params", "BLOCK"], "expected NAME=VALUE"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    problem_source: str | None,
    extra: list[str],
    message: str,
) -> None:
    problem = EXAMPLES / "kernelbench" / "vector_add.py"
    if problem_source is not None:
        problem = tmp_path / "bad_problem.py"
        problem.write_text(problem_source)
    seed = EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py"
    code, out, err = _run(
        ["eval", str(problem), str(seed), "--set", f"output_dir={tmp_path}", *extra], capsys
    )
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_missing_candidate_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        ["eval", str(EXAMPLES / "kernelbench" / "vector_add.py"), str(tmp_path / "nope.py")], capsys
    )
    assert code == 2 and "candidate file not found" in err
