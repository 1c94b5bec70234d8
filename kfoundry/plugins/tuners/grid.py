"""``grid``: exhaustive search over every valid configuration, in cross-product order."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kfoundry import hookimpl
from kfoundry.core.hookspecs import Register
from kfoundry.core.space import Config
from kfoundry.core.tuner import Tuner


class GridOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GridTuner(Tuner):
    """Every valid configuration in order (what the published KernelFoundry's parameter stage does)."""

    name = "grid"

    def __init__(self, options: GridOptions | None = None) -> None:
        self._next = 0

    def ask(self) -> Config | None:
        keys = self.space.keys
        if self._next >= len(keys):
            return None
        self._next += 1
        return self.space.config(keys[self._next - 1])


@hookimpl
def kf_register_tuners(register: Register) -> None:
    register(
        "grid", GridTuner, options=GridOptions, description="exhaustive grid over every valid configuration"
    )
