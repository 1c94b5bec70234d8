"""Archive, MAP-Elites, GA and random search: ask/tell behaviour and resumable state."""

from __future__ import annotations

import pytest

from kfoundry.core.archive import Archive
from kfoundry.core.models import Candidate, EvalRecord, Outcome, TimingStats
from kfoundry.core.search import SearchAsk, SearchResult
from kfoundry.plugins.search.ga import GAOptions, GeneticAlgorithm
from kfoundry.plugins.search.map_elites import MapElites, MapElitesOptions, neighbours
from kfoundry.plugins.search.random_search import RandomSearch


def cand(label: str, **params: int) -> Candidate:
    return Candidate(source=f"// {label}\n__kernel void k() {{}}", label=label, params=params)


def rec(outcome: Outcome = Outcome.correct, speedup: float | None = 1.0, ms: float = 1.0) -> EvalRecord:
    timing = TimingStats(
        median_ms=ms, iqr_ms=0.0, ci95_low_ms=ms, ci95_high_ms=ms, mean_ms=ms, min_ms=ms, n=5
    )
    return EvalRecord(
        candidate_hash="h",
        eval_key="k",
        problem="p",
        backend="opencl",
        device="d",
        outcome=outcome,
        speedup=speedup if outcome is Outcome.correct else None,
        timing=timing if outcome is Outcome.correct else None,
    )


def result(
    label: str,
    coords: tuple[int, ...],
    speedup: float = 1.0,
    outcome: Outcome = Outcome.correct,
    island: int = 0,
) -> SearchResult:
    return SearchResult(
        ask=SearchAsk(island=island), candidate=cand(label), record=rec(outcome, speedup), coords=coords
    )


def test_archive_keeps_the_fittest_per_cell_and_failures_until_beaten() -> None:
    a = Archive((4, 4, 4))
    assert a.insert(cand("fail"), rec(Outcome.mismatch), (0, 0, 0))
    assert a.coverage() == 0.0 and a.coverage(correct_only=False) == 1 / 64
    assert a.insert(cand("ok"), rec(speedup=1.5), (0, 0, 0))
    assert not a.insert(cand("slower"), rec(speedup=1.2), (0, 0, 0))
    assert a.insert(cand("far"), rec(speedup=3.0), (9, 9, 9))  # clipped into the grid
    assert a.get((3, 3, 3)).candidate.label == "far"
    assert a.best().candidate.label == "far"
    again = Archive.from_data(a.to_data())
    assert [c.candidate.label for c in again] == [c.candidate.label for c in a]
    assert len(a.empty_cells()) == 62


def test_neighbours_stay_in_the_grid() -> None:
    assert sorted(neighbours((0, 0, 3), (4, 4, 4))) == [(0, 0, 2), (0, 1, 3), (1, 0, 3)]


def test_map_elites_first_asks_create_then_improves_and_repairs() -> None:
    me = MapElites(MapElitesOptions(islands=2, exploitation=1.0, exploration=0.0))
    me.setup((4, 4, 4), seed=1)
    first = me.ask(4)
    assert all(a.mode == "create" and a.target_cell is not None for a in first)
    assert [a.island for a in first] == [0, 1, 0, 1]
    me.tell(
        [
            result("good", (1, 1, 0), 2.0, island=0),
            result("bad", (0, 0, 0), outcome=Outcome.compile_error, island=1),
        ]
    )
    asks = me.ask(4)
    assert all(a.parent is not None for a in asks)
    island0 = [a for a in asks if a.island == 0]
    assert all(a.parent.candidate.label == "good" and a.mode == "improve" for a in island0)
    assert all(a.target_cell == (1, 1, 0) for a in island0)  # exploitation aims at the parent's own cell
    island1 = [a for a in asks if a.island == 1]
    assert all(a.mode == "repair" for a in island1)  # only a failed elite there: repair it


def test_map_elites_exploration_aims_at_empty_neighbours() -> None:
    me = MapElites(MapElitesOptions(islands=1, exploitation=0.0, exploration=1.0))
    me.setup((4, 4, 4), seed=3)
    me.tell([result("a", (1, 1, 1))])
    for ask in me.ask(6):
        assert ask.target_cell in neighbours((1, 1, 1), (4, 4, 4))
        assert ask.extra["move"] == "explore"


def test_migrants_are_never_migrated_again() -> None:
    me = MapElites(MapElitesOptions(islands=3, migrate_every=1))
    me.setup((4, 4, 4), seed=0)
    me.tell([result("star", (2, 2, 2), 5.0, island=0)])  # generation 1: migrates to island 1
    assert me.archive.get((2, 2, 2), 1).migrated
    me.tell([])  # generation 2: island 1 holds only a migrant, which must stay put
    assert me.archive.get((2, 2, 2), 2) is None
    assert me.archive.get((2, 2, 2), 0).migrated is False


def test_strategy_state_round_trip_gives_identical_future_asks() -> None:
    a = MapElites()
    a.setup((4, 4, 4), seed=7)
    a.tell([result("x", (0, 1, 0), 1.0), result("y", (3, 3, 1), 2.0, island=1)])
    b = MapElites()
    b.load_state_dict(a.state_dict())
    assert [x.model_dump() for x in a.ask(5)] == [y.model_dump() for y in b.ask(5)]


def test_ga_tournament_crossover_and_elitism() -> None:
    ga = GeneticAlgorithm(GAOptions(population=3, tournament=2, crossover_rate=1.0, elitism=1))
    ga.setup((4, 4, 4), seed=0)
    assert [a.mode for a in ga.ask(2)] == ["create", "create"]
    ga.tell(
        [
            result("a", (0, 0, 0), 1.0),
            result("b", (1, 0, 0), 3.0),
            result("c", (2, 0, 0), 2.0),
            result("d", (3, 0, 0), 0.5),
        ]
    )
    assert [p.candidate.label for p in ga.population] == ["b", "c", "a"]
    asks = ga.ask(6)
    assert all(
        a.extra.get("crossover") and a.inspirations and a.inspirations[0] is not a.parent for a in asks
    )
    ga.tell([result("e", (0, 1, 0), 0.1)])
    assert ga.population[0].candidate.label == "b"  # the elite survives
    restored = GeneticAlgorithm(GAOptions(population=3, tournament=2, crossover_rate=1.0, elitism=1))
    restored.load_state_dict(ga.state_dict())
    assert [p.candidate.label for p in restored.population] == [p.candidate.label for p in ga.population]


def test_random_search_always_starts_from_a_seed() -> None:
    rs = RandomSearch()
    rs.setup((4, 4, 4), seed=0)
    rs.tell([result("seed", (0, 0, 0), 1.0), result("broken", (0, 0, 1), outcome=Outcome.mismatch)])
    rs.tell([result("later", (3, 3, 3), 9.0)])
    asks = rs.ask(5)
    assert {a.parent.candidate.label for a in asks} == {"seed"}
    assert all(a.mode == "improve" and a.extra["random"] for a in asks)


@pytest.mark.parametrize("name", ["map_elites", "ga", "random_search"])
def test_strategies_are_plugins_with_strict_options(kf_plugin_manager, name: str) -> None:
    spec = kf_plugin_manager.get("search", name)
    assert spec.build({}).name == name
    with pytest.raises(Exception, match="extra"):
        spec.options_model.model_validate({"no_such_option": 1})
