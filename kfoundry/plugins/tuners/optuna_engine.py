"""Optuna's samplers (GP, TPE) behind the tuner contract, over the ordinal indices of each parameter."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from kfoundry.core.space import Config, ConfigKey, ParamSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)


class OptunaEngine:
    """Ask/tell through an optuna study; numeric parameters are ordinal (index), others categorical."""

    def __init__(self, space: ParamSpace, engine: str, seed: int, initial: int) -> None:
        self.space = space
        self.dists: dict[str, BaseDistribution] = {}
        for name, values in space.params.items():
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            self.dists[name] = (
                IntDistribution(0, len(values) - 1)
                if numeric
                else CategoricalDistribution(list(range(len(values))))
            )
        if engine == "optuna-gp":
            sampler: optuna.samplers.BaseSampler = optuna.samplers.GPSampler(
                seed=seed, n_startup_trials=initial
            )
        else:
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=initial, multivariate=True)
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.pending: dict[ConfigKey, list[Any]] = {}
        self.worst: float | None = None

    def ask(self) -> Config:
        trial = self.study.ask(self.dists)
        config = {n: self.space.params[n][int(trial.params[n])] for n in self.space.names}
        self.pending.setdefault(self.space.key(config), []).append(trial)
        return config

    def _loss(self, value: float | None) -> float | None:
        if value is not None and value > 0:
            loss = math.log(value)
            self.worst = loss if self.worst is None else max(self.worst, loss)
            return loss
        return None if self.worst is None else self.worst + math.log(2.0)

    def tell(self, config: Config, value: float | None) -> None:
        loss = self._loss(value)
        key = self.space.key(config)
        trials = self.pending.get(key)
        state = optuna.trial.TrialState.COMPLETE if loss is not None else optuna.trial.TrialState.FAIL
        if trials:
            self.study.tell(trials.pop(0), loss if loss is not None else None, state=state)
            return
        if loss is None:
            return
        params = {n: self.space.indices(config)[i] for i, n in enumerate(self.space.names)}
        self.study.add_trial(optuna.trial.create_trial(params=params, distributions=self.dists, value=loss))
