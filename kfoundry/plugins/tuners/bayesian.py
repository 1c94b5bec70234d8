"""``bayesian``: Gaussian-process Bayesian optimisation with expected improvement over the discrete space.

The default engine (``gp``) models log-time with a Matern-5/2 ARD Gaussian process on the ordinal
encoding of the parameters (each value's index scaled to [0, 1]) and picks, among the valid
configurations not yet measured, the one with the largest expected improvement. It starts from the
seeds plus a few random configurations. Invalid configurations enter the model at the worst time
seen, steering it away from failing regions. ``optuna-gp`` and ``optuna-tpe`` run optuna's samplers
through the same contract (for comparison in ``benchmarks/tuners.py``).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from threadpoolctl import threadpool_limits

from kfoundry import hookimpl
from kfoundry.core.hookspecs import Register
from kfoundry.core.space import Config, ConfigKey, ParamSpace
from kfoundry.core.tuner import Tuner
from kfoundry.plugins.tuners.gp import GaussianProcess, expected_improvement


class BayesianOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Literal["gp", "optuna-gp", "optuna-tpe"] = Field(
        default="gp", description="gp: our GP + EI over the discrete space; optuna-*: optuna's samplers"
    )
    initial: int = Field(default=5, ge=1, description="random configurations before the model takes over")
    xi: float = Field(default=0.0, ge=0, description="EI exploration margin (standardised log-time units)")
    refit_growth: float = Field(
        default=1.25, gt=1.0, description="refit GP hyperparameters when the observations grow by this factor"
    )
    min_length_scale: float = Field(
        default=0.1,
        gt=0,
        description="smallest GP length scale (inputs are ordinal indices scaled to [0, 1])",
    )
    max_candidates: int = Field(default=20000, ge=100, description="configurations scored per ask")


class BayesianTuner(Tuner):
    """GP + expected improvement on log-time over the valid configurations."""

    name = "bayesian"

    def __init__(self, options: BayesianOptions | None = None) -> None:
        self.options = options or BayesianOptions()
        self._x: list[np.ndarray] = []
        self._y: list[float | None] = []
        self._seen: set[ConfigKey] = set()
        self._gp: GaussianProcess | None = None
        self._next_refit = 0
        self._optuna: Any = None

    def setup(self, space: ParamSpace, rng: np.random.Generator) -> None:
        super().setup(space, rng)
        self._gp = GaussianProcess(len(space.names), self.options.min_length_scale)
        self._seen_rows = np.zeros(space.size, dtype=bool)
        if self.options.engine != "gp":
            from kfoundry.plugins.tuners.optuna_engine import OptunaEngine

            self._optuna = OptunaEngine(
                space, self.options.engine, int(rng.integers(2**31)), self.options.initial
            )

    # -- ask/tell -------------------------------------------------------------------------------

    def tell(self, config: Config, value: float | None) -> None:
        if self._optuna is not None:
            self._optuna.tell(config, value)
            return
        key = self.space.key(config)
        if key in self._seen or not self.space.is_valid(config):
            return
        self._seen.add(key)
        self._seen_rows[self.space.position[key]] = True
        self._x.append(self.space.encode(config))
        self._y.append(math.log(value) if value is not None and value > 0 else None)

    def ask(self) -> Config | None:
        if self._optuna is not None:
            return self._optuna.ask()
        space = self.space
        if len(self._seen) >= space.size:
            return None
        valid = [y for y in self._y if y is not None]
        if len(self._seen) < self.options.initial or len(valid) < 2:
            return self._random_unseen()
        with threadpool_limits(limits=1, user_api="blas"):  # small matrices: threads only contend
            return self._best_ei(valid)

    # -- internals ------------------------------------------------------------------------------

    def _random_unseen(self) -> Config:
        rows = np.flatnonzero(~self._seen_rows)
        return self.space.config(self.space.keys[int(rows[int(self.rng.integers(len(rows)))])])

    def _candidates(self) -> np.ndarray:
        """Rows of the valid configurations to score (all, or a random subset of a huge space)."""
        n = self.space.size
        if n <= self.options.max_candidates:
            return np.arange(n)
        return self.rng.choice(n, size=self.options.max_candidates, replace=False)

    def _best_ei(self, valid: list[float]) -> Config:
        assert self._gp is not None
        worst = max(valid)
        x = np.array(self._x)
        y = np.array([worst if v is None else v for v in self._y])
        optimize = len(y) >= self._next_refit
        if optimize:
            self._next_refit = max(len(y) + 1, math.ceil(len(y) * self.options.refit_growth))
        self._gp.fit(x, y, optimize=optimize)
        rows = self._candidates()
        rows = rows[~self._seen_rows[rows]]
        keys = self.space.keys
        if len(rows) == 0:
            return self._random_unseen()
        mean, std = self._gp.predict(self.space.encoded[rows])
        best = self._gp.standardise(min(valid))
        ei = expected_improvement(mean, std, best, self.options.xi)
        return self.space.config(keys[int(rows[int(np.argmax(ei))])])


@hookimpl
def kf_register_tuners(register: Register) -> None:
    register(
        "bayesian",
        BayesianTuner,
        options=BayesianOptions,
        description="Gaussian process + expected improvement over the discrete space (optuna engines optional)",
    )
