"""The optimize loop's pieces on their own: typed stop reasons, the generator chosen by what its plugin
declares (not by its name), the export suffix from the language registry, and the layering (the loop
imports no command and writes no SQL)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kfoundry.core.config import RunConfig
from kfoundry.core.db import loop as loop_db
from kfoundry.core.ensemble import calls_language_model
from kfoundry.core.models import Candidate, EvalRecord, Outcome, TimingStats
from kfoundry.core.plugins import PluginManager
from kfoundry.core.run.budgets import Budgets
from kfoundry.core.run.export import export_best
from kfoundry.core.run.planning import seed_count
from kfoundry.core.run.state import LoopState, StopKind
from kfoundry.core.search import SearchAsk, SearchResult
from kfoundry.core.store import Store

CORE = Path(__file__).resolve().parent.parent / "kfoundry" / "core"
RUN_MODULES = [CORE / "loop.py", *sorted((CORE / "run").glob("*.py"))]


def _record(problem: str = "p") -> EvalRecord:
    timing = TimingStats(
        median_ms=1.0, iqr_ms=0.1, ci95_low_ms=0.9, ci95_high_ms=1.1, mean_ms=1.0, min_ms=0.9, n=5
    )
    return EvalRecord(
        candidate_hash="h", eval_key="k", problem=problem, backend="opencl", device="d",
        outcome=Outcome.correct, timing=timing, speedup=2.0,
    )  # fmt: skip


def test_budget_stops_are_typed(tmp_path: Path) -> None:
    config = RunConfig.model_validate({"budget": {"generations": 3, "evaluations": 1, "wall_time_s": 10}})
    ticks = iter([0.0, 1.0, 2.0, 20.0])
    state = LoopState()
    with Store(tmp_path / "kf.db") as store:
        budgets = Budgets(config.budget, store, "r", state, lambda: next(ticks))
        assert budgets.check() is None  # 1 s of 10, no evaluation yet, generation 0 of 3
        row = loop_db.Row(
            generation=0, idx=0, ask=SearchAsk(), candidate=Candidate(source="x"), generator="g"
        )
        loop_db.insert_proposals(store, "r", [row])
        row.record = _record()
        loop_db.save_verdict(store, "r", row)
        stop = budgets.check(before_evaluation=True)
        assert stop is not None and stop.kind is StopKind.EVALUATIONS and stop.device_budget_spent
        assert stop.text == "evaluation budget (1) spent"
        wall = budgets.check()
        assert wall is not None and wall.kind is StopKind.WALL_TIME and "wall time budget (10 s)" in wall.text
    state.generation = 3
    with Store(tmp_path / "kf2.db") as store:
        done = Budgets(
            RunConfig().budget.model_copy(update={"generations": 3}), store, "r", state, lambda: 0.0
        )
        stop = done.check()
        assert stop is not None and stop.kind is StopKind.GENERATIONS and not stop.device_budget_spent
        assert done.check(before_evaluation=True) is None


def test_a_verdict_stores_the_cell_the_evaluation_placed_it_in(tmp_path: Path) -> None:
    """Measured traffic can move a kernel from its planned cell; resume must read the moved one."""
    with Store(tmp_path / "kf.db") as store:
        moved = loop_db.Row(
            generation=0, idx=0, ask=SearchAsk(), candidate=Candidate(source="a"), generator="g"
        )
        kept = loop_db.Row(
            generation=0, idx=1, ask=SearchAsk(), candidate=Candidate(source="b"), generator="g"
        )
        moved.coords, kept.coords = (1, 2, 3), (0, 0, 1)
        loop_db.insert_proposals(store, "r", [moved, kept])
        moved.coords, moved.record = (3, 2, 1), _record()
        kept.coords, kept.record = None, _record()  # no new placement: the planned cell stays
        loop_db.save_verdict(store, "r", moved)
        loop_db.save_verdict(store, "r", kept)
        assert [r.coords for r in loop_db.proposals(store, "r", 0)] == [(3, 2, 1), (0, 0, 1)]


def test_the_generator_is_chosen_by_what_its_plugin_declares(kf_plugin_manager: PluginManager) -> None:
    offline = RunConfig.model_validate({"budget": {"proposals_per_generation": 2}})
    assert not calls_language_model(offline.llms[0], kf_plugin_manager)
    assert seed_count(offline) == 8  # free seeds
    paid = RunConfig.model_validate(
        {
            "budget": {"proposals_per_generation": 2},
            "llms": [{"name": "openai", "model": "m"}, {"name": "offline"}],
        }
    )
    assert calls_language_model(paid.llms[0], kf_plugin_manager)
    assert seed_count(paid) == 2


@pytest.mark.parametrize(("language", "suffix"), [("opencl", ".cl"), ("cuda", ".cu")])
def test_export_takes_the_suffix_from_the_language_registry(
    kf_plugin_manager: PluginManager, tmp_path: Path, language: str, suffix: str
) -> None:
    cand = Candidate(source="__kernel void k() {}", kind="native", language=language, label="k")
    best = SearchResult(ask=SearchAsk(), candidate=cand, record=_record(), coords=(0, 0, 0))
    path = export_best(best, "p", tmp_path)
    assert path == tmp_path / f"best_p_{language}{suffix}" and path.read_text() == cand.source
    assert (tmp_path / "best.json").is_file()
    assert export_best(None, "p", tmp_path / "none") is None


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("path", RUN_MODULES, ids=lambda p: p.name)
def test_the_run_imports_no_command_names_no_plugin_and_writes_no_sql(path: Path) -> None:
    assert not any(name.startswith("kfoundry.core.commands") for name in _imports(path))
    text = path.read_text()
    assert '"offline"' not in text and "__name__ !=" not in text
    assert not any(word in text for word in ("SELECT ", "INSERT ", "UPDATE ", "CREATE TABLE"))
    assert len(text.splitlines()) <= 400


def test_an_exported_kernelbench_model_waits_for_its_kernels(
    kf_plugin_manager: PluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """best_<problem>.py: a caller reading an output right after forward must not read it unfinished
    (launches are asynchronous), so the exported ModelNew synchronises the backend after each call."""
    import kfoundry.runtime

    source = "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x + 1\n"
    cand = Candidate(source=source, kind="kernelbench", language="opencl", label="k")
    best = SearchResult(ask=SearchAsk(), candidate=cand, record=_record(), coords=(0, 0, 0))
    path = export_best(best, "p", tmp_path)
    assert path is not None and path.name == "best_p_opencl.py"
    waits: list[int] = []
    monkeypatch.setattr(kfoundry.runtime, "synchronize", lambda: waits.append(1))
    namespace: dict[str, object] = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    model = namespace["ModelNew"]()  # type: ignore[operator]
    assert model.forward(1) == 2 and waits == [1]
