"""``nevergrad``: nevergrad's discrete optimisers (default: the portfolio discrete one-plus-one).

Each numeric parameter is an ordered ``TransitionChoice`` (mutations move to nearby values), others
a ``Choice``. The driver's tabu list guarantees no configuration is measured twice: a repeat is
answered from memory, and a configuration outside the restrictions costs nothing and is reported as
invalid (loss above the worst seen).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kfoundry import hookimpl
from kfoundry.core.hookspecs import Register
from kfoundry.core.space import Config, ConfigKey, ParamSpace
from kfoundry.core.tuner import Tuner, TunerError

#: The ask budget handed to nevergrad; the driver enforces the real budget.
_NG_BUDGET = 100_000


class NevergradOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    optimizer: str = Field(default="PortfolioDiscreteOnePlusOne", description="a nevergrad optimizer name")

    @field_validator("optimizer")
    @classmethod
    def _known(cls, name: str) -> str:
        import nevergrad as ng  # here, not at module level: importing it takes about a second

        if name not in ng.optimizers.registry:
            raise ValueError(f"unknown nevergrad optimizer {name!r}")
        return name


class NevergradTuner(Tuner):
    """A nevergrad optimizer over the ordered parameter values."""

    name = "nevergrad"

    def __init__(self, options: NevergradOptions | None = None) -> None:
        self.options = options or NevergradOptions()
        self._pending: dict[ConfigKey, list[Any]] = {}
        self._worst: float | None = None

    def setup(self, space: ParamSpace, rng: np.random.Generator) -> None:
        import nevergrad as ng

        super().setup(space, rng)
        choices: dict[str, Any] = {}
        for name, values in space.params.items():
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            choices[name] = (
                ng.p.TransitionChoice(values) if numeric and len(values) > 1 else ng.p.Choice(values)
            )
        param = ng.p.Dict(**choices)
        param.random_state = np.random.RandomState(int(rng.integers(2**31)))
        try:
            self.opt = ng.optimizers.registry[self.options.optimizer](
                parametrization=param, budget=_NG_BUDGET
            )
        except Exception as exc:
            raise TunerError(f"nevergrad optimizer {self.options.optimizer}: {exc}") from None

    def ask(self) -> Config | None:
        cand = self.opt.ask()
        config = dict(cand.value)
        self._pending.setdefault(self.space.key(config), []).append(cand)
        return config

    def tell(self, config: Config, value: float | None) -> None:
        if value is not None and value > 0:
            loss = math.log(value)
            self._worst = loss if self._worst is None else max(self._worst, loss)
        else:
            loss = (self._worst if self._worst is not None else 30.0) + math.log(4.0)
        pending = self._pending.get(self.space.key(config))
        if pending:
            self.opt.tell(pending.pop(0), loss)
            return
        # a seed or a driver draw: tell it as a point the optimizer did not ask for (some refuse)
        with contextlib.suppress(Exception):
            self.opt.tell(self.opt.parametrization.spawn_child(new_value=dict(config)), loss)


@hookimpl
def kf_register_tuners(register: Register) -> None:
    register(
        "nevergrad",
        NevergradTuner,
        options=NevergradOptions,
        description="nevergrad discrete optimizers (portfolio one-plus-one) with a tabu on repeats",
    )
