"""``kf-run eval`` with several candidates judges them as one batch through the executor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from eval_helpers import BAD, EXAMPLES

pytestmark = pytest.mark.slow  # real compiles: tens of seconds here


def test_kf_run_eval_takes_several_candidates(tmp_path: Path) -> None:
    code = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
    args = [
        "eval",
        str(EXAMPLES / "kernelbench" / "vector_add.py"),
        str(EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py"),
        str(BAD / "compile_error.py"),
        "--shape",
        "N=512",
        "--json",
        "--no-cache",
        "--set",
        f"output_dir={tmp_path}",
        "--set",
        "executor.options.workers=2",
        "--set",
        "evaluation.trials=1",
        "--set",
        "evaluation.target_time_s=0.005",
        "--set",
        "evaluation.correctness_budget_s=0.0",
    ]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]  # not all correct
    records = json.loads(done.stdout)
    assert [r["outcome"] for r in records] == ["correct", "compile_error"]  # in the order given
