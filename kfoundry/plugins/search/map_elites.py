"""MAP-Elites with islands: the published KernelFoundry's quality-diversity search.

Each island keeps its own grid of elites. A request picks an island round-robin, then one of three
moves: exploitation (a fit elite, aimed at its own cell), exploration (any elite, aimed at an empty
or weak neighbouring cell) or a fresh random kernel aimed at an empty cell. Every ``migrate_every``
generations each island's best elite is copied to the next island; a migrant is never migrated again.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field, model_validator

from kfoundry import hookimpl
from kfoundry.core.archive import Coords, fitness
from kfoundry.core.hookspecs import Register
from kfoundry.core.models import ArchiveCell
from kfoundry.core.search import (
    SearchAsk,
    SearchOptions,
    SearchResult,
    SearchStrategy,
    attempt,
    mode_for,
    tournament,
)


class MapElitesOptions(SearchOptions):
    """Options of the ``map_elites`` search."""

    islands: int = Field(default=4, ge=1, description="independent archives with migration")
    exploitation: float = Field(default=0.7, ge=0, le=1, description="share of fit-elite improvements")
    exploration: float = Field(default=0.2, ge=0, le=1, description="share aimed at empty/weak cells")
    migrate_every: int = Field(default=2, ge=1, description="generations between migrations")
    tournament: int = Field(default=3, ge=1, description="tournament size for exploitation")
    inspirations: int = Field(default=2, ge=0, description="other elites shown to the generator")

    @model_validator(mode="after")
    def _shares(self) -> MapElitesOptions:
        if self.exploitation + self.exploration > 1.0 + 1e-9:
            raise ValueError("exploitation + exploration must be at most 1 (the rest is random)")
        return self


def neighbours(coords: Coords, dims: tuple[int, ...]) -> list[Coords]:
    """Cells one step away along one axis."""
    out = []
    for axis, value in enumerate(coords):
        for step in (-1, 1):
            v = value + step
            if 0 <= v < dims[axis]:
                out.append(coords[:axis] + (v,) + coords[axis + 1 :])
    return out


class MapElites(SearchStrategy):
    """Island MAP-Elites with exploitation / exploration / random moves and one-way migration."""

    name = "map_elites"

    def __init__(self, options: MapElitesOptions | None = None) -> None:
        super().__init__(options)
        self.opts = options or MapElitesOptions()
        self.generation = 0

    @property
    def islands(self) -> int:
        return self.opts.islands

    def ask(self, n: int) -> list[SearchAsk]:
        asks = []
        for _ in range(n):
            island = self.asks % self.islands
            asks.append(self._one(island, self.rng()))
            self.asks += 1
        return asks

    def _one(self, island: int, rng: random.Random) -> SearchAsk:
        cells = self.archive.elites(island) or self.archive.elites()
        empty = self.archive.empty_cells(island)
        if not cells:
            return SearchAsk(mode="create", target_cell=rng.choice(empty) if empty else None, island=island)
        roll = rng.random()
        if roll < self.opts.exploitation:
            correct = [c for c in cells if c.record.is_correct] or cells
            parent = tournament(correct, self.opts.tournament, rng)
            target: Coords | None = tuple(parent.coords)
            kind = "exploit"
        elif roll < self.opts.exploitation + self.opts.exploration:
            parent = rng.choice(cells)
            target = self._frontier(parent, island, rng)
            kind = "explore"
        else:
            target = rng.choice(empty) if empty else rng.choice(self.archive.all_coords())
            parent = min(cells, key=lambda c: _distance(c.coords, target))
            kind = "random"
        others = [c for c in cells if c is not parent]
        rng.shuffle(others)
        return SearchAsk(
            mode=mode_for(parent),
            parent=attempt(parent),
            inspirations=[attempt(c) for c in others[: self.opts.inspirations]],
            target_cell=target,
            island=island,
            extra={"move": kind},
        )

    def _frontier(self, parent: ArchiveCell, island: int, rng: random.Random) -> Coords:
        """An empty neighbour of ``parent`` if any, else its weakest neighbour."""
        near = neighbours(tuple(parent.coords), self.archive.dims)
        empty = [c for c in near if self.archive.get(c, island) is None]
        if empty:
            return rng.choice(empty)
        if not near:
            return tuple(parent.coords)
        return min(near, key=lambda c: fitness(self.archive.get(c, island).record))  # type: ignore[union-attr]

    def tell(self, results: list[SearchResult]) -> None:
        super().tell(results)
        self.generation += 1
        if self.islands > 1 and self.generation % self.opts.migrate_every == 0:
            self.migrate()

    def migrate(self) -> None:
        """Copy each island's best non-migrant elite to the next island (ring)."""
        moves = []
        for island in range(self.islands):
            natives = [c for c in self.archive.elites(island) if not c.migrated and c.record.is_correct]
            if natives:
                moves.append((natives[0], (island + 1) % self.islands))
        for cell, dest in moves:
            self.archive.insert(cell.candidate, cell.record, tuple(cell.coords), dest, migrated=True)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "generation": self.generation}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.generation = int(state.get("generation", 0))


def _distance(a: Coords, b: Coords) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


@hookimpl
def kf_register_search(register: Register) -> None:
    register("map_elites", MapElites, options=MapElitesOptions, description=MapElites.__doc__ or "")
