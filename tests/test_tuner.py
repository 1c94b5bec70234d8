"""The tuner driver and every bundled tuner: budgets, tabu, restrictions, seeds, invalid results."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from kfoundry.core.config import TunerConfig, build_plugin
from kfoundry.core.models import DeviceProfile
from kfoundry.core.plugins import PluginManager
from kfoundry.core.space import Config, ParamSpace
from kfoundry.core.tuner import MAX_STALE_ASKS, Budget, Measurement, Tuner, run_tuner

TUNERS: list[tuple[str, dict[str, Any]]] = [
    ("grid", {}),
    ("random", {}),
    ("bayesian", {}),
    ("bayesian", {"engine": "optuna-tpe", "initial": 4}),
    ("nevergrad", {}),
]
IDS = ["grid", "random", "bayesian", "bayesian-tpe", "nevergrad"]
PARAMS = {"BLOCK_SIZE_X": [4, 8, 16, 32, 64], "BLOCK_SIZE_Y": [1, 2, 4, 8], "UNROLL": [1, 2, 4, 8]}


def bowl(config: Config) -> float:
    """A smooth synthetic objective over the ordinal indices (minimum 1.0 at 16 x 2 x 4)."""
    ix = {"BLOCK_SIZE_X": [4, 8, 16, 32, 64], "BLOCK_SIZE_Y": [1, 2, 4, 8], "UNROLL": [1, 2, 4, 8]}
    target = {"BLOCK_SIZE_X": 2, "BLOCK_SIZE_Y": 1, "UNROLL": 2}
    return 1.0 + sum((ix[k].index(config[k]) - t) ** 2 for k, t in target.items())


def build(kf_plugin_manager: PluginManager, name: str, options: dict[str, Any]) -> Tuner:
    return build_plugin(TunerConfig(name=name, options=options), "tuner", kf_plugin_manager)


@pytest.mark.parametrize(("name", "options"), TUNERS, ids=IDS)
def test_budget_is_never_overrun_and_nothing_is_measured_twice(
    kf_plugin_manager: PluginManager, name: str, options: dict[str, Any]
) -> None:
    space = ParamSpace(PARAMS, ["BLOCK_SIZE_X * BLOCK_SIZE_Y <= 128"])
    calls: list[Config] = []

    def objective(config: Config) -> float:
        assert space.is_valid(config)
        calls.append(dict(config))
        return bowl(config)

    for budget in (1, 7, 25):
        calls.clear()
        trace = run_tuner(
            space, objective, build(kf_plugin_manager, name, options), Budget(evaluations=budget), seed=3
        )
        assert len(calls) == len(trace.trials) == budget
        assert max(Counter(tuple(c.values()) for c in calls).values()) == 1
        assert trace.stop_reason == "evaluation budget spent"


@pytest.mark.parametrize(("name", "options"), TUNERS, ids=IDS)
def test_restrictions_and_device_limits_are_never_evaluated(
    kf_plugin_manager: PluginManager, name: str, options: dict[str, Any]
) -> None:
    dev = DeviceProfile(backend="opencl", name="small", max_work_group_size=64, local_mem_bytes=2048)
    space = ParamSpace(
        PARAMS, ["UNROLL <= BLOCK_SIZE_X"], device=dev, local_mem_expr="16 * BLOCK_SIZE_X * UNROLL"
    )
    seen: list[Config] = []

    def objective(config: Config) -> float:
        assert config["BLOCK_SIZE_X"] * config["BLOCK_SIZE_Y"] <= 64
        assert 16 * config["BLOCK_SIZE_X"] * config["UNROLL"] <= 2048
        assert config["UNROLL"] <= config["BLOCK_SIZE_X"]
        seen.append(config)
        return bowl(config)

    trace = run_tuner(
        space, objective, build(kf_plugin_manager, name, options), Budget(evaluations=200), seed=1
    )
    assert len(seen) == len(trace.trials) == space.size  # exhausted, all of it within the limits
    assert trace.stop_reason == "space exhausted"
    assert min(t.value for t in trace.trials if t.value is not None) == min(bowl(c) for c in space.configs())


def test_wall_time_budget_stops_before_an_evaluation_would_overrun() -> None:
    now = [0.0]
    space = ParamSpace(PARAMS)

    def objective(config: Config) -> float:
        now[0] += 1.0  # every evaluation takes one second
        return bowl(config)

    from kfoundry.plugins.tuners.random_tuner import RandomTuner

    trace = run_tuner(space, objective, RandomTuner(), Budget(wall_time_s=5.5), clock=lambda: now[0])
    assert len(trace.trials) == 5 and now[0] <= 5.5
    assert trace.stop_reason == "wall-time budget spent"


class Stubborn(Tuner):
    """Asks the same configuration forever, and an invalid one now and then."""

    name = "stubborn"

    def __init__(self) -> None:
        self.told: list[tuple[Config, float | None]] = []
        self.asks = 0

    def ask(self) -> Config | None:
        self.asks += 1
        if self.asks % 3 == 0:
            return {"BLOCK_SIZE_X": 64, "BLOCK_SIZE_Y": 8, "UNROLL": 1}  # violates the restriction
        return {"BLOCK_SIZE_X": 4, "BLOCK_SIZE_Y": 1, "UNROLL": 1}

    def tell(self, config: Config, value: float | None) -> None:
        self.told.append((dict(config), value))


def test_tabu_and_restrictions_hold_against_a_stubborn_tuner() -> None:
    space = ParamSpace(PARAMS, ["BLOCK_SIZE_X * BLOCK_SIZE_Y <= 128"])
    evaluated: list[tuple[Any, ...]] = []

    def objective(config: Config) -> float:
        evaluated.append(tuple(config.values()))
        return bowl(config)

    tuner = Stubborn()
    trace = run_tuner(space, objective, tuner, Budget(evaluations=4), seed=0)
    assert len(evaluated) == len(set(evaluated)) == 4  # the driver drew unseen configurations
    assert trace.skipped >= 3 * MAX_STALE_ASKS
    # the repeat is answered from memory; the invalid ask is told invalid; neither is evaluated
    assert ({"BLOCK_SIZE_X": 64, "BLOCK_SIZE_Y": 8, "UNROLL": 1}, None) in tuner.told
    assert tuner.told.count(({"BLOCK_SIZE_X": 4, "BLOCK_SIZE_Y": 1, "UNROLL": 1}, 1.0 + 4 + 1 + 4)) > 1


@pytest.mark.parametrize(("name", "options"), TUNERS, ids=IDS)
def test_invalid_results_are_reported_as_invalid_not_slow(
    kf_plugin_manager: PluginManager, name: str, options: dict[str, Any]
) -> None:
    space = ParamSpace(PARAMS)
    told: list[float | None] = []
    tuner = build(kf_plugin_manager, name, options)
    original = tuner.tell

    def spy(config: Config, value: float | None) -> None:
        told.append(value)
        original(config, value)

    tuner.tell = spy  # type: ignore[method-assign]

    def objective(config: Config) -> Measurement:
        if config["UNROLL"] == 8:  # e.g. too many registers: the compiler refuses
            return Measurement(None, "compile", "ptxas: too many resources")
        return Measurement(bowl(config))

    trace = run_tuner(space, objective, tuner, Budget(evaluations=30), seed=2)
    invalid = [t for t in trace.trials if t.config["UNROLL"] == 8]
    assert all(t.value is None and t.measurement.invalidity == "compile" for t in invalid)
    assert told.count(None) >= len(invalid)
    assert all(v is None or math.isfinite(v) for v in told)


@pytest.mark.parametrize(("name", "options"), TUNERS, ids=IDS)
def test_seeds_come_first_and_replay_is_deterministic(
    kf_plugin_manager: PluginManager, name: str, options: dict[str, Any]
) -> None:
    space = ParamSpace(PARAMS)
    seeds = [
        {"BLOCK_SIZE_X": 16, "BLOCK_SIZE_Y": 2, "UNROLL": 4},
        {"BLOCK_SIZE_X": 8, "BLOCK_SIZE_Y": 1, "UNROLL": 2},
    ]

    def run(seed: int) -> list[tuple[Any, ...]]:
        tuner = build(kf_plugin_manager, name, options)
        trace = run_tuner(space, bowl, tuner, Budget(evaluations=15), seeds=seeds, seed=seed)
        assert [t.config for t in trace.trials[:2]] == seeds and all(t.seeded for t in trace.trials[:2])
        assert trace.best is not None and trace.best.value == 1.0
        return [tuple(t.config.values()) for t in trace.trials]

    assert run(5) == run(5)


def test_model_based_tuners_beat_random_on_a_smooth_space(kf_plugin_manager: PluginManager) -> None:
    params = {f"P{i}": list(range(8)) for i in range(3)}
    space = ParamSpace(params)

    def objective(config: Config) -> float:
        return 1.0 + sum((v - 5) ** 2 for v in config.values())

    def evals_to_optimum(name: str, options: dict[str, Any], seed: int) -> int:
        trace = run_tuner(
            space, objective, build(kf_plugin_manager, name, options), Budget(evaluations=80), seed=seed
        )
        return trace.evaluations_to(1.0) or 81

    bayes = sorted(evals_to_optimum("bayesian", {}, s) for s in range(3))[1]
    rand = sorted(evals_to_optimum("random", {}, s) for s in range(3))[1]
    assert bayes < 60 < rand  # random needs 256 on average to find 1 of 512 (seeds fixed: deterministic)
