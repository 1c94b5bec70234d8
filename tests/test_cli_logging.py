"""Without a terminal (``kf-run ... | cat``), kf-run logs one line per evaluation and per generation as it goes."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kfoundry.core.cli import configure_logging

ROOT = Path(__file__).parents[1]
CLI = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
VADD = """
import torch
import torch.nn as nn

N = 256


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.rand(N), torch.rand(N)]


def get_init_inputs():
    return []
"""
FAST = [
    "evaluation.trials=2",
    "evaluation.target_time_s=0.01",
    "evaluation.warmup_s=0.0",
    "evaluation.min_repeats=3",
    "evaluation.max_repeats=5",
    "evaluation.rotate_bytes=0",
    "evaluation.timeout_s=60",
    "evaluation.correctness_budget_s=0.0",
    "evaluation.shape_variants=0",
    "tuner.every=-1",
]


@pytest.mark.slow
def test_progress_lines_arrive_while_the_run_goes(kf_problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = kf_problem(textwrap.dedent(VADD), name="log_vadd")
    sets = [f"output_dir={tmp_path}", "budget.generations=1", *FAST]
    args = [sys.executable, "-c", CLI, str(path), "--json", *[x for s in sets for x in ("--set", s)]]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stderr is not None and proc.stdout is not None
    lines: list[tuple[str, bool]] = []  # (line, the process was still running when it arrived)
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        lines.append((line.rstrip("\n"), proc.poll() is None))
        assert time.monotonic() < deadline, "kf-run took too long"
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 0, "\n".join(text for text, _ in lines)[-3000:]
    evals = [(text, live) for text, live in lines if " eval " in text and "kfoundry.core.loop" in text]
    result = json.loads(out)  # stdout holds the JSON result only
    n = result["evaluations"]
    assert n >= 2 and [text.split(" eval ")[1].split(":")[0] for text, _ in evals] == [
        str(i) for i in range(1, n + 1)
    ]
    assert evals[0][1], "the first evaluation's line came only after the run ended"
    assert all(" INFO kfoundry.core.loop: gen 0 eval " in text for text, _ in evals)
    [done] = [text for text, _ in lines if "generation 0 done: " in text]
    assert f"{n} evaluations" in done
    assert any("stopped: all 1 generations done" in text for text, _ in lines)
    assert result["best"]["outcome"] == "correct"
    assert Path(result["report"]).is_file()


def test_quiet_and_verbose_levels() -> None:
    stream = io.StringIO()
    assert configure_logging(0, False, stream) is False  # not a terminal: plain lines at INFO
    logger = logging.getLogger("kfoundry.core.loop")
    logger.info("gen 0 eval 1: shown")
    logger.debug("hidden")
    configure_logging(0, True, stream)  # -q
    logger.info("gen 0 eval 2: hidden")
    logger.warning("kept")
    configure_logging(1, False, stream)  # -v
    logger.debug("debug shown")
    text = stream.getvalue()
    assert "gen 0 eval 1: shown" in text and "hidden" not in text and "kept" in text and "debug shown" in text
    ours = [h for h in logging.getLogger("kfoundry").handlers if h.get_name() == "kf-run"]
    assert len(ours) == 1  # reconfiguring replaces the handler
    configure_logging(0, False, sys.stderr)
