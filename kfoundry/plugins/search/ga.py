"""A genetic algorithm: tournament selection, crossover of two parents, mutation, elitism.

The population is the ``population`` fittest distinct kernels seen so far (the ``elitism`` best are
never displaced by newcomers of equal fitness). A crossover asks the generator to combine a parent
with a second one (shown as the first inspiration, ``extra.crossover``); a mutation asks it to
improve (or repair) one parent.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator

from kfoundry import hookimpl
from kfoundry.core.archive import fitness
from kfoundry.core.generator import Attempt
from kfoundry.core.hookspecs import Register
from kfoundry.core.search import SearchAsk, SearchOptions, SearchResult, SearchStrategy, mode_for


class GAOptions(SearchOptions):
    """Options of the ``ga`` search."""

    model_config = ConfigDict(extra="forbid")

    population: int = Field(default=8, ge=2, description="kernels kept between generations")
    tournament: int = Field(default=2, ge=1, description="tournament size for parent selection")
    crossover_rate: float = Field(default=0.4, ge=0, le=1, description="share of children from two parents")
    elitism: int = Field(default=2, ge=0, description="best kernels always kept")

    @field_validator("steady_state")
    @classmethod
    def _no_steady_state(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "the ga strategy breeds each generation from the last one's results, so it cannot plan ahead"
            )
        return value


class GeneticAlgorithm(SearchStrategy):
    """Tournament selection, crossover and mutation over a fixed-size population."""

    name = "ga"
    plans_ahead = False

    def __init__(self, options: GAOptions | None = None) -> None:
        super().__init__(options)
        self.opts = options or GAOptions()
        self.population: list[Attempt] = []

    def ask(self, n: int) -> list[SearchAsk]:
        out = []
        for _ in range(n):
            rng = self.rng()
            self.asks += 1
            if not self.population:
                out.append(SearchAsk(mode="create"))
                continue
            p1 = self._select(rng)
            if len(self.population) > 1 and rng.random() < self.opts.crossover_rate:
                p2 = self._select(rng, exclude=p1)
                out.append(SearchAsk(mode="improve", parent=p1, inspirations=[p2], extra={"crossover": True}))
            else:
                out.append(SearchAsk(mode=mode_for(p1), parent=p1, extra={"mutation": True}))
        return out

    def _select(self, rng: Any, exclude: Attempt | None = None) -> Attempt:
        pool = [p for p in self.population if p is not exclude] or self.population
        picks = [rng.choice(pool) for _ in range(self.opts.tournament)]
        return max(picks, key=lambda a: fitness(a.record))

    def tell(self, results: list[SearchResult]) -> None:
        super().tell(results)
        elite = sorted(self.population, key=lambda a: -fitness(a.record))[: self.opts.elitism]
        seen = {a.candidate.content_hash for a in elite}
        pool = list(elite)
        newcomers = [Attempt(candidate=r.candidate, record=r.record, cell=r.coords) for r in results]
        rest = sorted(
            [a for a in self.population + newcomers if a not in elite],
            key=lambda a: -fitness(a.record),
        )
        for a in rest:
            if len(pool) >= self.opts.population:
                break
            if a.candidate.content_hash not in seen:
                seen.add(a.candidate.content_hash)
                pool.append(a)
        self.population = pool

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "population": [a.model_dump(mode="json") for a in self.population]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.population = [Attempt.model_validate(a) for a in state.get("population", [])]


@hookimpl
def kf_register_search(register: Register) -> None:
    register("ga", GeneticAlgorithm, options=GAOptions, description=GeneticAlgorithm.__doc__ or "")
