"""``random``: uniform sampling of valid configurations without replacement (the baseline)."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from kfoundry import hookimpl
from kfoundry.core.hookspecs import Register
from kfoundry.core.space import Config, ParamSpace
from kfoundry.core.tuner import Tuner


class RandomOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RandomTuner(Tuner):
    """A random permutation of the valid configurations."""

    name = "random"

    def __init__(self, options: RandomOptions | None = None) -> None:
        self._order: np.ndarray | None = None
        self._next = 0

    def setup(self, space: ParamSpace, rng: np.random.Generator) -> None:
        super().setup(space, rng)
        self._order = rng.permutation(space.size)

    def ask(self) -> Config | None:
        assert self._order is not None
        if self._next >= len(self._order):
            return None
        self._next += 1
        return self.space.config(self.space.keys[int(self._order[self._next - 1])])


@hookimpl
def kf_register_tuners(register: Register) -> None:
    register(
        "random",
        RandomTuner,
        options=RandomOptions,
        description="uniform random sampling without replacement",
    )
