"""The Python API: kfoundry.evaluate / tune / optimize return typed results (real PoCL evaluations)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import kfoundry
from kfoundry.core.errors import ConfigError
from kfoundry.core.models import EvalRecord, TuningResult

ROOT = Path(__file__).parents[1]
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
]


@pytest.mark.slow
def test_evaluate_and_tune(tmp_path: Path) -> None:
    problem = ROOT / "examples" / "native" / "vector_add.toml"
    kernel = ROOT / "examples" / "native" / "vector_add.cl"
    sets = [*FAST, f"output_dir={tmp_path}"]
    record = kfoundry.evaluate(
        problem, kernel, params={"BLOCK": 64, "VEC": 2}, shapes={"N": 4096}, overrides=sets
    )
    assert isinstance(record, EvalRecord) and record.is_correct and record.speedup and record.timing
    tuned = kfoundry.tune(problem, kernel, evaluations=3, tuner="random", shapes={"N": 4096}, overrides=sets)
    assert isinstance(tuned, TuningResult) and tuned.evaluations == 3 and tuned.best_params
    assert set(tuned.best_params) == {"BLOCK", "VEC"}


def test_bad_input_is_a_kferror(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="problem file not found: nowhere.py"):
        kfoundry.optimize("nowhere.py", output_dir=tmp_path)
    assert kfoundry.OptimizeResult.__name__ == "OptimizeResult"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        kfoundry.nothing  # type: ignore[attr-defined]  # noqa: B018


def test_a_missing_warm_start_source_fails_before_the_run(tmp_path: Path) -> None:
    missing = tmp_path / "other_host_runs"
    with pytest.raises(ConfigError, match=r"tuner.warm_start: .*other_host_runs: no such file"):
        kfoundry.optimize(
            ROOT / "examples" / "kernelbench" / "softmax.py", output_dir=tmp_path / "runs",
            overrides=[f"tuner.warm_start=[{str(missing)!r}]".replace("'", '"')],
        )  # fmt: skip
    assert not (tmp_path / "runs").exists()  # no run folder was made
    with pytest.raises(ConfigError, match="other_host_runs"):
        kfoundry.tune(ROOT / "examples" / "native" / "vector_add.toml", ROOT / "examples" / "native" / "vector_add.cl",
                      warm_start=[missing], overrides=[f"output_dir={json.dumps(str(tmp_path))}"])  # fmt: skip


@pytest.mark.slow
def test_the_documented_one_liner(tmp_path: Path) -> None:
    """The issue's own check: optimize softmax for two generations from a one-line script."""
    code = (
        "import kfoundry; r = kfoundry.optimize('examples/kernelbench/softmax.py', generations=2, "
        f"output_dir={str(tmp_path)!r}); print(r.best.speedup)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=1200, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) > 0
    [run_dir] = list(tmp_path.iterdir())
    assert (run_dir / "report.html").is_file() and (run_dir / "best.json").is_file()


def test_a_missing_plotly_costs_the_report_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the report extra a finished run still ends well: a warning, no report.html (seen on the H200)."""
    import kfoundry.api as api
    from kfoundry.core.report import page

    def no_plotly() -> None:
        raise ImportError("the report needs plotly: pip install 'kfoundry[report]'")

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setattr(page, "plotly_go", no_plotly)
    monkeypatch.setattr("kfoundry.core.report.html.render_report", lambda run: page.plotly_go())
    monkeypatch.setattr("kfoundry.core.report.html.load_run", lambda path: SimpleNamespace(run_dir=run_dir))
    assert api.write_report(run_dir) is None
    assert not (run_dir / "report.html").exists()
