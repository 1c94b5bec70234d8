"""A tuner's configurations go to the evaluator in batches as wide as the executor (real PoCL jobs),
and the evaluation budget still holds exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from eval_helpers import EXAMPLES, fast_config

from kfoundry.core.commands.eval import read_candidate
from kfoundry.core.config import TunerConfig
from kfoundry.core.evaluation import Evaluator
from kfoundry.core.problem import load_problem
from kfoundry.core.store import Store
from kfoundry.core.tuning import tune_candidate
from kfoundry.plugins.executors.local import LocalExecutor, LocalOptions

pytestmark = pytest.mark.slow  # real compiles: tens of seconds here


def test_tuner_batches_follow_the_executor_and_keep_the_budget(tmp_path: Path) -> None:
    problem = load_problem(EXAMPLES / "native" / "matmul.toml", {"M": 24, "N": 20, "K": 16})
    candidate = read_candidate(EXAMPLES / "native" / "matmul.cl").model_copy(update={"params": {"WPT": 2}})
    store = Store(tmp_path / "kf.sqlite")
    batches: list[int] = []
    executor = LocalExecutor(LocalOptions(workers=2))
    with Evaluator(
        problem, fast_config(tmp_path, trials=1), store=store, run_id="t", executor=executor
    ) as ev:
        many = ev.evaluate_many

        def counted(candidates: list[Any], on_record: Any = None) -> Any:
            batches.append(len(candidates))
            return many(candidates, on_record)

        ev.evaluate_many = counted  # type: ignore[method-assign]
        result = tune_candidate(
            ev,
            candidate,
            TunerConfig(name="random", evaluations=5),
            seeds=[{"BLOCK_X": 4, "BLOCK_Y": 4, "WPT": 1}],
        )
    compiled = store.list_candidates("t")
    store.close()
    assert (
        result.evaluations == 5 and len(compiled) == 5
    )  # the budget, exactly: nothing evaluated ahead of it
    assert batches and max(batches) == 2 and sum(batches) == 5  # the seeds together, then the tuner's pairs
    assert all(t["invalidity"] == "correct" for t in result.trials), [t["message"] for t in result.trials]
    assert result.best_time_ms is not None
