"""The search-strategy contract (plugin kind ``search``): ask for proposals, tell evaluated results.

A strategy decides *what to ask the generator for*: which parent to improve or repair, which
inspirations to show, which archive cell to aim at. The loop turns each :class:`SearchAsk` into a
:class:`~kfoundry.core.generator.GenerationRequest`, evaluates the proposals and hands the verdicts
back through :meth:`SearchStrategy.tell`. Every strategy keeps an :class:`Archive` (so coverage is
comparable between strategies) and serialises its whole state to plain data for ``kf-run resume``.
Randomness comes from ``Random(seed, ask counter)``, so a resumed run makes the same choices.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kfoundry.core.archive import Archive, Coords, fitness
from kfoundry.core.behaviour.axes import AxisSpec, DescriptorChoice, resolve
from kfoundry.core.generator import Attempt
from kfoundry.core.models import ArchiveCell, Candidate, EvalRecord

Mode = Literal["create", "improve", "repair"]


class SearchOptions(BaseModel):
    """Options every search strategy shares: the archive's behaviour descriptors."""

    model_config = ConfigDict(extra="forbid")

    descriptors: DescriptorChoice = Field(
        default="static",
        description='archive axes: "static" (memory, compute, parallelism from source patterns), "measured" '
        "(intensity, hierarchy, mix, occupancy from the compiled kernel) or a list of axis names or "
        "{name, edges} tables",
    )
    steady_state: bool = Field(
        default=False,
        description="plan the next generation (strategy asks, generator and language-model calls) while "
        "this one is compiled and timed; its asks see the archive one generation stale. Only strategies "
        "that allow it (map_elites, random_search) accept it",
    )
    profile: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="the ncu traffic pass (achieved DRAM/L2/L1 bytes of each correct candidate, run in the "
        'sandbox): "auto" runs it when the axes include intensity or hierarchy and the backend is cuda; '
        "where ncu is missing or refused, one warning line and the static estimates",
    )

    @field_validator("descriptors", mode="before")
    @classmethod
    def _axes(cls, value: Any) -> Any:
        """One clear line for a bad choice (rather than one per member of the union)."""
        if isinstance(value, str) and value not in ("static", "measured"):
            raise ValueError(f'must be "static", "measured" or a list of axes, not {value!r}')
        if isinstance(value, list):
            axes = [AxisSpec.model_validate({"name": a} if isinstance(a, str) else a) for a in value]
            resolve(list(axes))
            return axes
        return value


class SearchAsk(BaseModel):
    """What the strategy wants the generator to produce next."""

    mode: Mode = "create"
    parent: Attempt | None = None
    inspirations: list[Attempt] = Field(default_factory=list)
    target_cell: Coords | None = None
    island: int = 0
    #: Free-form hints for generators (e.g. ``{"crossover": True}``).
    extra: dict[str, Any] = Field(default_factory=dict)


class SearchResult(BaseModel):
    """One evaluated proposal, as told back to the strategy."""

    ask: SearchAsk
    candidate: Candidate
    record: EvalRecord
    coords: Coords


def attempt(cell: ArchiveCell) -> Attempt:
    """An archive elite as a generator :class:`Attempt`."""
    return Attempt(candidate=cell.candidate, record=cell.record, cell=tuple(cell.coords))


class SearchStrategy(ABC):
    """Ask/tell search over kernels; subclasses implement :meth:`ask` and may extend :meth:`tell`."""

    name: str = "search"
    #: Whether asks for the next generation may be made before this one's results are told.
    plans_ahead: bool = True

    def __init__(self, options: BaseModel | None = None) -> None:
        self.options = options
        self.archive = Archive()
        self.seed = 0
        self.asks = 0
        self.tells = 0
        #: Every correct or failed result seen, as (fitness, candidate hash) of the best so far.
        self.best: SearchResult | None = None

    def setup(self, dims: tuple[int, ...], seed: int, axes: list[dict[str, Any]] | None = None) -> None:
        """Prepare an empty search over a descriptor grid of ``dims`` (``axes``: names and bin edges)."""
        self.archive = Archive(dims, self.islands, axes=axes)
        self.seed = seed

    @property
    def islands(self) -> int:
        return 1

    def rng(self) -> random.Random:
        """A generator seeded by (seed, ask counter): a resumed run draws the same numbers."""
        return random.Random(f"{self.seed}:{self.asks}")

    @abstractmethod
    def ask(self, n: int) -> list[SearchAsk]:
        """``n`` requests for the next generation."""

    def tell(self, results: list[SearchResult]) -> None:
        """Record evaluated results: archive insertion and best-so-far."""
        for res in results:
            self.tells += 1
            self.archive.insert(res.candidate, res.record, res.coords, res.ask.island)
            if self.best is None or fitness(res.record) > fitness(self.best.record):
                self.best = res

    # -- resume ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this search in another process."""
        return {
            "archive": self.archive.to_data(),
            "seed": self.seed,
            "asks": self.asks,
            "tells": self.tells,
            "best": self.best.model_dump(mode="json") if self.best else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.archive = Archive.from_data(state["archive"])
        self.seed = int(state["seed"])
        self.asks = int(state["asks"])
        self.tells = int(state["tells"])
        self.best = SearchResult.model_validate(state["best"]) if state.get("best") else None


def mode_for(cell: ArchiveCell | Attempt) -> Mode:
    """Repair a failed parent, improve a correct one."""
    record = cell.record
    return "improve" if record is not None and record.is_correct else "repair"


def tournament(cells: list[ArchiveCell], k: int, rng: random.Random) -> ArchiveCell:
    """The fittest of ``k`` cells drawn at random."""
    picks = [rng.choice(cells) for _ in range(max(1, k))]
    return max(picks, key=lambda c: fitness(c.record))
