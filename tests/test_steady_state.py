"""The steady-state mode on PoCL: the next generation is planned while this one is judged."""

from __future__ import annotations

import textwrap
import threading
import time
from typing import Any

import pytest
from eval_helpers import LOOP_FAST_EVAL

from kfoundry.core.config import ConfigError
from kfoundry.core.generator import GenerationRequest, Generator
from kfoundry.core.loop import OptimizeLoop, new_run_dir
from kfoundry.core.models import Proposal

SOFTMAX = """
import torch
import torch.nn as nn

batch_size = 8
dim = 300


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
"""

FAST_EVAL = [*LOOP_FAST_EVAL, "evaluation.shape_variants=0"]


class SlowModel(Generator):
    """The offline generator behind a model's latency: every call waits ``delay`` seconds first."""

    name = "slow-offline"

    def __init__(self, inner: Generator, delay: float) -> None:
        self.inner, self.delay = inner, delay
        self.calls: list[tuple[int, float, str]] = []  # (generation, start, thread name)
        self._lock = threading.Lock()

    def propose(self, request: GenerationRequest) -> list[Proposal]:
        with self._lock:
            self.calls.append((request.generation, time.monotonic(), threading.current_thread().name))
        time.sleep(self.delay)
        return self.inner.propose(request)


def _loop(
    kf_config: Any, kf_problem: Any, steady: bool
) -> tuple[OptimizeLoop, SlowModel, list[tuple[int, float]]]:
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.run.planning import build_generator
    from kfoundry.core.store import Store

    path = kf_problem(textwrap.dedent(SOFTMAX), name="steady_softmax")
    config = kf_config(
        {},
        "budget.generations=2",
        "budget.proposals_per_generation=2",
        "tuner.every=-1",
        f"search.options.steady_state={'true' if steady else 'false'}",
        *FAST_EVAL,
    )
    run_id, run_dir = new_run_dir(config, "steady_softmax")
    problem = load_problem(path, {})
    store = Store(run_dir / "kfoundry.db")
    evaluator = Evaluator(problem, config, store, run_id)
    model = SlowModel(build_generator(config, store, run_id, run_dir, evaluator.backend.language), 0.5)
    loop = OptimizeLoop(
        config, problem, evaluator, store, run_id, run_dir, generator=model, initial_proposals=2
    )
    verdicts: list[tuple[int, float]] = []
    judge = loop._evaluate

    def timed(row: Any, record: Any = None) -> None:
        judge(row, record)
        verdicts.append((row.generation, time.monotonic()))

    loop._evaluate = timed  # type: ignore[method-assign]
    return loop, model, verdicts


@pytest.mark.parametrize("steady", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_the_next_generation_is_planned_while_this_one_is_judged(kf_config, kf_problem, steady: bool) -> None:
    loop, model, verdicts = _loop(kf_config, kf_problem, steady)
    summary = loop.run()
    assert summary.best is not None and summary.best.record.is_correct
    stored = loop.rows()
    assert {r.generation for r in stored} == {0, 1}
    assert all(r.record is not None for r in stored)  # every planned proposal was judged, none twice
    assert len(verdicts) == len(stored) == summary.evaluations
    for g in (1,):
        first_call = min(t for gen, t, _ in model.calls if gen == g)
        last_verdict_before = max(t for gen, t in verdicts if gen == g - 1)
        if steady:  # the model was already asked for g while g - 1 was still being judged
            assert first_call < last_verdict_before
        else:
            assert first_call > last_verdict_before
    ahead = {name.startswith("kf-plan-ahead") for gen, _, name in model.calls if gen > 0}
    assert ahead == ({True} if steady else {False})
    assert loop.ahead.planned == ([1] if steady else [])


def test_a_strategy_that_needs_every_result_refuses_the_mode(kf_config) -> None:
    with pytest.raises(ConfigError) as info:
        kf_config({}, "search.name=ga", "search.options.steady_state=true")
    text = str(info.value)
    assert "\n" not in text and "steady_state" in text and "cannot plan ahead" in text
