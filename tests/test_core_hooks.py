"""Every hook: documented, typed, in docs/plugins.md, and exercised by a test (the datasette habit)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from kfoundry import hookimpl
from kfoundry.core import hooks, hookspecs
from kfoundry.core.config import RunConfig, load_config
from kfoundry.core.models import Candidate, EvalRecord, Outcome
from kfoundry.core.payloads import GenerationSummary, RunSummary, resolved_run_config
from kfoundry.core.plugins import REGISTRATION_HOOKS

ROOT = Path(__file__).parents[1]
HOOK_NAMES = sorted(name for name in vars(hookspecs) if name.startswith("kf_"))


@pytest.mark.parametrize("name", HOOK_NAMES)
def test_hook_is_documented_and_typed(name: str) -> None:
    spec = getattr(hookspecs, name)
    assert (spec.__doc__ or "").strip(), f"{name} has no docstring"
    signature = inspect.signature(spec)
    assert signature.return_annotation is not inspect.Signature.empty, f"{name} has no return type"
    for param in signature.parameters.values():
        assert param.annotation is not inspect.Parameter.empty, f"{name}.{param.name} has no type"
        assert f":param {param.name}:" in spec.__doc__, f"{name} does not document its parameter {param.name}"
    if signature.return_annotation != "None":
        assert ":return:" in spec.__doc__, f"{name} does not document what it returns"
    assert "Added in " in spec.__doc__, f"{name} has no version note"
    assert name in hookspecs.__all__, f"{name} is missing from hookspecs.__all__"
    assert f"def {name}(" in (ROOT / "docs" / "hooks.md").read_text(), f"{name} is missing from docs/hooks.md"
    docs = (ROOT / "docs" / "plugins.md").read_text()
    assert f"def {name}(" in docs, f"{name} is missing from docs/plugins.md"


@pytest.mark.parametrize("name", HOOK_NAMES)
def test_hook_is_exercised_by_a_test(name: str) -> None:
    """Some test other than this file's parametrisation must call or implement the hook."""
    here = Path(__file__).name
    uses = [
        p
        for p in (ROOT / "tests").rglob("test_*.py")
        if p.name != here and re.search(rf"\b{name}\b", p.read_text())
    ]
    own = re.findall(rf"def {name}\(", Path(__file__).read_text())
    assert uses or own, f"no test exercises {name}"


class _Recorder:
    """Implements every lifecycle hook and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @hookimpl
    def kf_static_checks(self, candidate: Candidate, problem_name: str) -> list[str] | None:
        self.calls.append(("kf_static_checks", {"problem_name": problem_name}))
        return ["uses printf"] if "printf" in candidate.source else None

    @hookimpl
    def kf_candidate_evaluated(self, candidate: Candidate, record: EvalRecord) -> None:
        self.calls.append(("kf_candidate_evaluated", {"outcome": record.outcome}))

    @hookimpl
    def kf_generation_finished(self, run_id: str, generation: int, summary: GenerationSummary) -> None:
        self.calls.append(("kf_generation_finished", {"generation": generation, "summary": summary}))
        summary.extra["recorder"] = generation

    @hookimpl
    def kf_run_started(self, run_id: str, config: RunConfig) -> None:
        self.calls.append(("kf_run_started", {"run_id": run_id, "config": config}))

    @hookimpl
    def kf_run_finished(self, run_id: str, summary: RunSummary) -> None:
        self.calls.append(("kf_run_finished", {"run_id": run_id, "summary": summary}))
        summary.extra["recorder"] = "seen"


def test_lifecycle_wrappers_reach_plugins(kf_register_plugin) -> None:  # type: ignore[no-untyped-def]
    recorder = _Recorder()
    manager = kf_register_plugin(recorder, name="recorder")
    good = Candidate(source="__kernel void k() {}")
    bad = Candidate(source='__kernel void k() { printf("x"); }')
    assert hooks.static_checks(good, "vadd", manager) == []
    assert hooks.static_checks(bad, "vadd", manager) == ["uses printf"]
    record = EvalRecord(
        candidate_hash=good.content_hash,
        eval_key="k",
        problem="vadd",
        backend="opencl",
        device="cpu",
        outcome=Outcome.correct,
        speedup=1.5,
    )
    hooks.candidate_evaluated(good, record, manager)
    config = resolved_run_config(load_config(overrides=["seed=3"]), manager)
    hooks.run_started("run-1", config, manager)
    generation = hooks.generation_finished(
        "run-1", 3, GenerationSummary(evaluations=12, best_speedup=2.0, coverage=0.25), manager
    )
    summary = RunSummary(
        run_id="run-1",
        run_dir="kf-runs/run-1",
        stop_reason="budget",
        generations=4,
        evaluations=12,
        best_speedup=2.0,
    )
    assert hooks.run_finished("run-1", summary, manager) is summary
    names = [name for name, _ in recorder.calls]
    assert names == [
        "kf_static_checks",
        "kf_static_checks",
        "kf_candidate_evaluated",
        "kf_run_started",
        "kf_generation_finished",
        "kf_run_finished",
    ]
    assert recorder.calls[2][1]["outcome"] is Outcome.correct
    started = recorder.calls[3][1]["config"]
    assert isinstance(started, RunConfig) and started.seed == 3
    assert started.search.options, "the resolved config carries the plugins' option defaults"
    assert recorder.calls[4][1]["generation"] == 3 and generation.best_speedup == 2.0
    assert generation.extra == {"recorder": 3} and summary.extra == {"recorder": "seen"}


def test_lifecycle_wrappers_refuse_plain_data(kf_register_plugin) -> None:  # type: ignore[no-untyped-def]
    recorder = _Recorder()
    manager = kf_register_plugin(recorder, name="recorder")
    with pytest.raises(TypeError, match="^run_started: config must be a RunConfig, got dict$"):
        hooks.run_started("run-1", {"seed": 5}, manager)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match="^generation_finished: summary must be a GenerationSummary, got dict$"
    ):
        hooks.generation_finished("run-1", 0, {"evaluations": 4, "coverage": 0.0}, manager)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^run_finished: summary must be a RunSummary, got dict$"):
        hooks.run_finished("run-1", {"run_id": "run-1"}, manager)  # type: ignore[arg-type]
    assert recorder.calls == [], "no plugin saw a malformed payload"
    with pytest.raises(ValidationError, match="coverage"):
        GenerationSummary(evaluations=4, coverage=3.0)


class _Opts(BaseModel):
    level: int = 1


class _RegistersEverything:
    @hookimpl
    def kf_register_backends(self, register):  # type: ignore[no-untyped-def]
        register("t-backend", lambda o: ("backend", o.level), options=_Opts)

    @hookimpl
    def kf_register_llms(self, register):  # type: ignore[no-untyped-def]
        register("t-llm", lambda o: ("llm", o.level), options=_Opts)

    @hookimpl
    def kf_register_search(self, register):  # type: ignore[no-untyped-def]
        register("t-search", lambda o: ("search", o.level), options=_Opts)

    @hookimpl
    def kf_register_tuners(self, register):  # type: ignore[no-untyped-def]
        register("t-tuner", lambda o: ("tuner", o.level), options=_Opts)

    @hookimpl
    def kf_register_hardware(self, register):  # type: ignore[no-untyped-def]
        register("t-hardware", lambda o: ("hardware", o.level), options=_Opts)

    @hookimpl
    def kf_register_executors(self, register):  # type: ignore[no-untyped-def]
        register("t-executor", lambda o: ("executor", o.level), options=_Opts)

    @hookimpl
    def kf_register_descriptors(self, register):  # type: ignore[no-untyped-def]
        register("t-descriptor", lambda o: ("descriptor", o.level), options=_Opts)

    @hookimpl
    def kf_register_languages(self, register):  # type: ignore[no-untyped-def]
        register("t-language", lambda o: ("language", o.level), options=_Opts)


def test_every_registration_hook_registers_and_builds(kf_register_plugin) -> None:  # type: ignore[no-untyped-def]
    manager = kf_register_plugin(_RegistersEverything(), name="everything")
    assert manager.infos["everything"].registered == {kind: [f"t-{kind}"] for kind in REGISTRATION_HOOKS}
    for kind in REGISTRATION_HOOKS:
        spec = manager.get(kind, f"t-{kind}")
        assert spec.package == "(test)"
        assert spec.build({"level": 7}) == (kind, 7)
    # the plugin and its names vanish together
    manager.remove_plugin("everything")
    assert all(f"t-{kind}" not in manager.registry(kind) for kind in REGISTRATION_HOOKS)
