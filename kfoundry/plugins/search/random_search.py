"""Random sampling from the seed: the baseline every other strategy must beat.

Every request starts again from one of the first correct kernels (the seeds): the generator proposes
a random variation of it, and nothing learnt from later results steers the next request.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from kfoundry import hookimpl
from kfoundry.core.generator import Attempt
from kfoundry.core.hookspecs import Register
from kfoundry.core.search import SearchAsk, SearchOptions, SearchResult, SearchStrategy


class RandomOptions(SearchOptions):
    """Options of the ``random_search`` baseline."""

    model_config = ConfigDict(extra="forbid")

    create_share: float = Field(default=0.0, ge=0, le=1, description="share of fresh creations")


class RandomSearch(SearchStrategy):
    """Independent random variations of the seed kernels."""

    name = "random_search"

    def __init__(self, options: RandomOptions | None = None) -> None:
        super().__init__(options)
        self.opts = options or RandomOptions()
        self.seeds: list[Attempt] = []

    def ask(self, n: int) -> list[SearchAsk]:
        out = []
        for _ in range(n):
            rng = self.rng()
            self.asks += 1
            correct = [s for s in self.seeds if s.record is not None and s.record.is_correct]
            if not correct or rng.random() < self.opts.create_share:
                out.append(SearchAsk(mode="create", extra={"random": True}))
            else:
                out.append(SearchAsk(mode="improve", parent=rng.choice(correct), extra={"random": True}))
        return out

    def tell(self, results: list[SearchResult]) -> None:
        first = not self.seeds
        super().tell(results)
        if first:
            self.seeds = [Attempt(candidate=r.candidate, record=r.record, cell=r.coords) for r in results]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "seeds": [a.model_dump(mode="json") for a in self.seeds]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.seeds = [Attempt.model_validate(a) for a in state.get("seeds", [])]


@hookimpl
def kf_register_search(register: Register) -> None:
    register("random_search", RandomSearch, options=RandomOptions, description=RandomSearch.__doc__ or "")
