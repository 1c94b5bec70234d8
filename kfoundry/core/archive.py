"""The quality-diversity archive: a grid over behaviour descriptors, one elite per cell and island.

An elite is replaced only by a fitter kernel (stage score 0-5 plus speedup when correct, as in the
published KernelFoundry), so failures stay in the archive until something better lands in their
cell. The archive knows the descriptor axes it is laid out on (names and bin edges) and serialises
them with its cells, so a resumed run can tell whether its configuration still describes the archive.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product
from typing import Any

from kfoundry.core.models import ArchiveCell, Candidate, EvalRecord

Coords = tuple[int, ...]


def fitness(record: EvalRecord | None) -> float:
    """Stage score plus speedup (correct only); -1 for no record."""
    return -1.0 if record is None else record.fitness


class Archive:
    """Elites keyed by (island, coordinates) on a grid of ``dims`` (e.g. 4x4x4)."""

    def __init__(
        self, dims: tuple[int, ...] = (4, 4, 4), islands: int = 1, axes: list[dict[str, Any]] | None = None
    ) -> None:
        if not dims or any(d < 1 for d in dims) or islands < 1:
            raise ValueError("archive needs positive dimensions and at least one island")
        if axes is not None and len(axes) != len(dims):
            raise ValueError(f"archive has {len(dims)} dimensions but {len(axes)} axes")
        self.dims = tuple(dims)
        self.islands = islands
        #: The descriptor axes (``{"name", "edges"}``) along ``dims``; None when not recorded.
        self.axes = [dict(a) for a in axes] if axes is not None else None
        self._cells: dict[tuple[int, Coords], ArchiveCell] = {}

    # -- updates -------------------------------------------------------------------------------------

    def clip(self, coords: Coords) -> Coords:
        """Coordinates clamped into the grid."""
        return tuple(min(max(int(c), 0), d - 1) for c, d in zip(coords, self.dims, strict=True))

    def insert(
        self,
        candidate: Candidate,
        record: EvalRecord,
        coords: Coords,
        island: int = 0,
        migrated: bool = False,
    ) -> bool:
        """Place ``candidate`` in its cell if the cell is empty or it beats the elite; True if placed."""
        key = (island % self.islands, self.clip(coords))
        current = self._cells.get(key)
        if current is not None and fitness(record) <= fitness(current.record):
            return False
        self._cells[key] = ArchiveCell(
            coords=key[1], island=key[0], candidate=candidate, record=record, migrated=migrated
        )
        return True

    # -- queries -------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._cells)

    def __iter__(self) -> Iterator[ArchiveCell]:
        return iter(sorted(self._cells.values(), key=lambda c: (c.island, c.coords)))

    def get(self, coords: Coords, island: int = 0) -> ArchiveCell | None:
        return self._cells.get((island, self.clip(coords)))

    def elites(self, island: int | None = None, correct_only: bool = False) -> list[ArchiveCell]:
        """Elites of one island (all islands when None), fittest first."""
        cells = [c for c in self._cells.values() if island is None or c.island == island]
        if correct_only:
            cells = [c for c in cells if c.record.is_correct]
        return sorted(cells, key=lambda c: -fitness(c.record))

    def best(self, island: int | None = None) -> ArchiveCell | None:
        """The fittest elite (correct ones beat every failure by the stage score)."""
        elites = self.elites(island)
        return elites[0] if elites else None

    def all_coords(self) -> list[Coords]:
        return [tuple(c) for c in product(*(range(d) for d in self.dims))]

    def empty_cells(self, island: int = 0) -> list[Coords]:
        return [c for c in self.all_coords() if (island, c) not in self._cells]

    def coverage(self, correct_only: bool = True) -> float:
        """Share of grid cells holding an elite on any island (correct elites only by default)."""
        filled = {c.coords for c in self._cells.values() if not correct_only or c.record.is_correct}
        return len(filled) / len(self.all_coords())

    # -- persistence -----------------------------------------------------------------------------------

    def axis_names(self) -> list[str]:
        """Names of the axes (``axis0``, ... when they were not recorded)."""
        return (
            [str(a["name"]) for a in self.axes] if self.axes else [f"axis{i}" for i in range(len(self.dims))]
        )

    def to_data(self) -> dict[str, Any]:
        return {
            "dims": list(self.dims),
            "islands": self.islands,
            "axes": self.axes,
            "cells": [c.model_dump(mode="json") for c in self],
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Archive:
        archive = cls(tuple(data["dims"]), int(data["islands"]), axes=data.get("axes"))
        for raw in data["cells"]:
            cell = ArchiveCell.model_validate(raw)
            archive._cells[(cell.island, tuple(cell.coords))] = cell
        return archive
