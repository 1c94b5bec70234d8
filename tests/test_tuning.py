"""The tuning stage on the real pipeline: PoCL compiles and times every configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_helpers import EXAMPLES, fast_config

from kfoundry.core.commands.eval import read_candidate
from kfoundry.core.config import TunerConfig
from kfoundry.core.evaluation import Evaluator
from kfoundry.core.models import EvalRecord, Outcome, TunableSpace
from kfoundry.core.problem import load_problem
from kfoundry.core.recorded import RecordedSpace
from kfoundry.core.store import Store
from kfoundry.core.tuner import Trial
from kfoundry.core.tuning import candidate_space, measurement_of, native_block, tune_candidate

SMALL = {"M": 24, "N": 20, "K": 16}


@pytest.mark.slow
def test_tuning_stage_honours_device_limits_budget_and_records(tmp_path: Path) -> None:
    problem = load_problem(EXAMPLES / "native" / "matmul.toml", SMALL)
    candidate = read_candidate(EXAMPLES / "native" / "matmul.cl").model_copy(update={"params": {"WPT": 2}})
    store = Store(tmp_path / "kf.sqlite")
    seen: list[tuple[Trial, EvalRecord]] = []
    with Evaluator(problem, fast_config(tmp_path, trials=2), store=store, run_id="tune-test") as evaluator:
        # pretend the device allows work-groups of 16 items at most: the space shrinks before compiling
        small_device = evaluator.device.model_copy(update={"max_work_group_size": 16})
        space = candidate_space(
            candidate,
            small_device,
            problem.space,
            constants=problem.shapes,
            problem_block=native_block(problem),
        )
        assert 0 < space.size < candidate_space(candidate, evaluator.device, problem.space).size
        result = tune_candidate(
            evaluator,
            candidate,
            TunerConfig(name="bayesian", evaluations=4),
            space=space,
            seeds=[{"BLOCK_X": 4, "BLOCK_Y": 4, "WPT": 1}],
            record_path=tmp_path / "rec.json",
            t4_path=tmp_path / "t4.json",
            on_trial=lambda t, r: seen.append((t, r)),
        )
    evaluated = [json.loads(row["params"]) for row in store.query("SELECT params FROM tuner_trials")]
    compiled = [c.params for c in store.list_candidates("tune-test")]
    store.close()
    assert result.evaluations == len(seen) == len(evaluated) == 4  # the budget, exactly
    assert len(compiled) == 4
    for params in compiled:  # nothing outside the device's limit ever reached the compiler
        assert params["BLOCK_X"] * params["BLOCK_Y"] <= 16
    # seeds first: the candidate's own values in force, then the given known-good configuration
    assert seen[0][0].config == {**problem.candidate_params(candidate), "WPT": 2} and seen[0][0].seeded
    assert seen[1][0].config == {"BLOCK_X": 4, "BLOCK_Y": 4, "WPT": 1} and seen[1][0].seeded
    assert all(r.outcome is Outcome.correct for _, r in seen)
    assert result.best_time_ms == min(r.timing.median_ms for _, r in seen if r.timing)
    assert result.best_params is not None and space.is_valid(result.best_params)
    rec = RecordedSpace.load(tmp_path / "rec.json")
    assert len(rec.entries) == 4 and rec.optimum == result.best_time_ms
    assert len(json.loads((tmp_path / "t4.json").read_text())["results"]) == 4


def test_failed_evaluations_are_invalid_not_slow() -> None:
    base = {"candidate_hash": "h", "eval_key": "k", "problem": "p", "backend": "opencl", "device": "d"}
    for outcome in Outcome:
        if outcome is Outcome.correct:
            continue
        m = measurement_of(EvalRecord(outcome=outcome, message="boom", **base))
        assert m.value is None and not m.valid and m.invalidity != "correct"


@pytest.mark.slow
def test_kf_run_tune_on_pocl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kfoundry.core.cli import main

    record = tmp_path / "vector_add.json"
    args = [
        "tune",
        str(EXAMPLES / "native" / "vector_add.toml"),
        str(EXAMPLES / "native" / "vector_add.cl"),
        "--shape",
        "N=4096",
        "--tuner",
        "grid",
        "--evaluations",
        "4",
        "--restrict",
        "BLOCK * VEC >= 256",
        "--params",
        "BLOCK=64",
        "--params",
        "VEC=4",
        "--record",
        str(record),
        "--json",
        "--set",
        f"output_dir={json.dumps(str(tmp_path))}",
        "--set",
        "evaluation.target_time_s=0.005",
        "--set",
        "evaluation.warmup_s=0.0",
        "--set",
        "evaluation.rotate_bytes=0",
        "--set",
        "evaluation.trials=2",
    ]
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 0
    result = json.loads(capsys.readouterr().out)
    # the candidate's own values first, then the grid in order, skipping what the restriction forbids
    order = [(t["params"]["BLOCK"], t["params"]["VEC"]) for t in result["trials"]]
    assert order == [(64, 4), (128, 2), (128, 4), (256, 1)]
    from kfoundry.core.tuning import merge_spaces

    merged = merge_spaces(None, TunableSpace(restrictions=["BLOCK * VEC <= 512"]))
    assert merged is not None and merged.restrictions == [
        "BLOCK * VEC <= 512"
    ]  # a restriction alone survives
    assert result["best_time_ms"] == min(t["time_ms"] for t in result["trials"] if t["time_ms"] is not None)
    assert len(RecordedSpace.load(record).entries) == 4
