"""Ensembles of real providers against the local server: vote, sample, bandit, novelty, caps, meta."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_server import LLMServer, Reply, fenced, script_responder, vecadd

from kfoundry.core import hooks
from kfoundry.core.config import RunConfig
from kfoundry.core.ensemble import Ensemble, borda, build_ensemble
from kfoundry.core.errors import ConfigError
from kfoundry.core.generator import Attempt, GenerationRequest, ProblemSummary
from kfoundry.core.llm.recording import load_recording
from kfoundry.core.models import Candidate, DeviceProfile, EvalRecord, Outcome
from kfoundry.core.payloads import RunSummary
from kfoundry.core.plugins import PluginManager
from kfoundry.core.store import Store

KEY = "sk-ens-5d1c9e0b7a2f4386"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMServer]:
    monkeypatch.setenv("KF_TEST_KEY", KEY)
    with LLMServer(key=KEY) as srv:
        yield srv


def config(
    srv: LLMServer, mode: str = "vote", keep: int = 2, weights: tuple[float, float] = (1, 1), **budget: Any
) -> RunConfig:
    opts = {"api_key_env": "KF_TEST_KEY", "max_retries": 1, "timeout": 5.0}
    return RunConfig.model_validate(
        {
            "llms": [
                {
                    "name": "openai",
                    "model": "gpt-test",
                    "weight": weights[0],
                    "options": {**opts, "base_url": srv.openai_url},
                },
                {
                    "name": "anthropic",
                    "model": "claude-test",
                    "weight": weights[1],
                    "options": {**opts, "base_url": srv.anthropic_url},
                },
            ],
            "ensemble": {"mode": mode, "keep": keep, "meta_every": 2},
            "budget": budget,
            "seed": 7,
        }
    )


def request(n: int = 2, generation: int = 0, parent: Attempt | None = None) -> GenerationRequest:
    return GenerationRequest(
        problem=ProblemSummary(name="vadd", reference_source="class Model: ...", shapes={"N": 4096}),
        language="opencl",
        device=DeviceProfile(backend="opencl", name="pocl", device_type="cpu"),
        n=n,
        generation=generation,
        parent=parent,
        mode="improve" if parent else "create",
    )


def record(
    c: Candidate, outcome: Outcome = Outcome.correct, speedup: float | None = 1.0, message: str = ""
) -> EvalRecord:
    return EvalRecord(
        candidate_hash=c.content_hash,
        eval_key=c.content_hash,
        problem="vadd",
        backend="opencl",
        device="pocl",
        outcome=outcome,
        speedup=speedup if outcome is Outcome.correct else None,
        message=message,
    )


def build(cfg: RunConfig, manager: PluginManager, tmp_path: Path, store: Store | None = None) -> Ensemble:
    return build_ensemble(cfg, store, manager=manager, run_id="run1", run_dir=tmp_path, attach=False)


def test_borda_counts_points_and_ties() -> None:
    assert borda([[3, 2, 1], [1, 3, 2], None], 3) == [2.0, 3.0, 1.0]
    assert borda([[1, 1, 0]], 3) == [1.5, 1.5, 0.0]


def test_vote_keeps_what_the_members_agree_on_and_stores_the_vote(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    kernels = [fenced(vecadd(b, w)) for b, w in ((32, 1), (64, 2))]
    server.openai.responder = script_responder(kernels, ranking="4 > 2 > 1 > 3")
    server.anthropic.responder = script_responder(
        [fenced(vecadd(128, 1)), fenced(vecadd(256, 4))], ranking="4 > 1 > 2 > 3"
    )
    store = Store(tmp_path / "store.sqlite")
    ens = build(config(server), kf_plugin_manager, tmp_path, store)
    kept = ens.propose(request(n=4))  # each member proposes 2; the vote keeps 2 of the 4
    # pool: 1=openai(32,1) 2=openai(64,2) 3=anthropic(128,1) 4=anthropic(256,4); Borda: 4 wins, then 1 and 2 tie (3 pts)
    assert [p.candidate.params for p in kept] == [{"BLOCK": 32, "WORK": 1}, {"BLOCK": 256, "WORK": 4}]
    assert [p.generator for p in kept] == ["openai:gpt-test", "anthropic:claude-test"]
    kinds = [r["kind"] for r in store.query("SELECT kind FROM llm_calls ORDER BY seq")]
    assert kinds.count("generate") == 4 and kinds.count("rank") == 2
    [vote] = store.query("SELECT * FROM llm_votes")
    assert vote["kept"] == "[0, 3]" and vote["run_id"] == "run1"
    assert (tmp_path / "llm_calls.jsonl").read_text().count("\n") == 6
    store.close()


def test_vote_with_parse_failures_returns_them_for_feedback(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = script_responder(["no code, sorry"])
    server.anthropic.responder = script_responder([fenced(vecadd(128, 1))])
    props = build(config(server, keep=1), kf_plugin_manager, tmp_path).propose(request(n=1))
    assert [p.candidate is not None for p in props] == [True, False]
    assert "no fenced code block" in (props[1].parse_error or "")
    assert not any(
        r for r in server.requests if "# Rank" in str(r["body"])
    )  # one valid proposal: no vote needed


def test_sample_mode_follows_weights(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = script_responder([fenced(vecadd(b, 1)) for b in range(1, 200)])
    server.anthropic.responder = script_responder([fenced(vecadd(b, 2)) for b in range(1, 200)])
    ens = build(config(server, mode="sample", weights=(4, 1)), kf_plugin_manager, tmp_path)
    props = ens.propose(request(n=40))
    by = [p.generator for p in props]
    assert len(props) == 40 and by.count("openai:gpt-test") > 2 * by.count("anthropic:claude-test") > 0


def test_bandit_prefers_the_member_with_more_gain_per_cost(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = script_responder([fenced(vecadd(b, 1)) for b in range(1, 400)])
    server.anthropic.responder = script_responder([fenced(vecadd(b, 2)) for b in range(1, 400)])
    ens = build(config(server, mode="bandit"), kf_plugin_manager, tmp_path)
    picks: list[str] = []
    for g in range(30):
        for p in ens.propose(request(n=1, generation=g)):
            picks.append(p.generator)
            good = p.generator.startswith("anthropic")
            ens.observe(p.candidate, record(p.candidate, Outcome.correct if good else Outcome.mismatch, 3.0))
    assert picks[:2] == ["openai:gpt-test", "anthropic:claude-test"]  # each tried once first
    assert picks[10:].count("anthropic:claude-test") > 2 * picks[10:].count("openai:gpt-test")


def test_novelty_drops_a_reformatted_duplicate(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    src = vecadd(64, 1)
    server.openai.responder = script_responder([fenced(src), fenced(src.replace("    ", "  ") + "# same\n")])
    cfg = config(server, mode="sample", weights=(1, 1e-9))
    ens = build(cfg, kf_plugin_manager, tmp_path)
    assert len(ens.propose(request(n=2))) == 1
    assert ens.novelty is not None and ens.novelty.rejected == 1


def test_caps_stop_exactly_and_are_shared_by_members(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = lambda body: Reply(
        fenced(vecadd(len(server.requests), 1)), tokens_in=3000, tokens_out=500
    )
    server.anthropic.responder = lambda body: Reply(
        fenced(vecadd(len(server.requests), 2)), tokens_in=3000, tokens_out=500
    )
    ens = build(config(server, mode="sample", llm_tokens=12000), kf_plugin_manager, tmp_path)
    made = sum(len(ens.propose(request(n=1, generation=g))) for g in range(10))
    assert ens.stop_reason.startswith("LLM budget exhausted")
    # each call really used 3500 tokens; the estimate of a ~4.5k-character prompt leaves room for 3 calls
    assert ens.ledger.total.tokens <= 12000
    assert made == ens.ledger.total.calls == len(server.requests) == 3
    assert ens.exhausted
    # the refused call is recorded (never sent) with the prompt estimate that no longer fit
    [refused] = [c for c in load_recording(tmp_path) if c.error_kind == "budget"]
    assert refused.attempts == 0 and refused.max_tokens + 16 > 12000 - ens.ledger.total.tokens


def test_meta_prompting_rewrites_a_section_that_later_prompts_use(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = script_responder(
        [fenced(vecadd(b, 1)) for b in range(1, 50)],
        meta_text="Measure bytes per element before anything else.",
    )
    server.anthropic.responder = script_responder([fenced(vecadd(b, 3)) for b in range(1, 50)])
    store = Store(tmp_path / "store.sqlite")
    ens = build(config(server, mode="sample"), kf_plugin_manager, tmp_path, store)
    for g in range(3):
        for p in ens.propose(request(n=1, generation=g)):
            ens.observe(p.candidate, record(p.candidate))
        ens.end_generation(g)
    assert ens.meta is not None and len(ens.meta.rewrites) == 1
    assert ens.meta.rewrites[0]["section"] == "philosophy"
    ens.propose(request(n=1, generation=3))  # the fresh variant is tried next
    last = server.requests[-1]["body"]
    assert "Measure bytes per element before anything else." in str(last)
    rows = store.query("SELECT id, parent_id, section FROM prompts ORDER BY generation")
    assert len(rows) == 2 and rows[1]["parent_id"] == rows[0]["id"] and rows[1]["section"] == "philosophy"
    assert store.query("SELECT COUNT(*) AS n FROM llm_calls WHERE kind='meta'")[0]["n"] == 1
    store.close()


def test_recurring_errors_are_distilled_into_pitfalls(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = script_responder([fenced(vecadd(b, 1)) for b in range(1, 50)])
    ens = build(config(server, mode="sample", weights=(1, 1e-9)), kf_plugin_manager, tmp_path)
    for line in (7, 9, 12):
        c = Candidate(source=vecadd(line, 5))
        rec = record(c, Outcome.compile_error)
        rec.log = f"<source>:{line}:5: error: use of undeclared identifier 'tid{line}'"
        ens.observe(c, rec)
    ens.propose(request(n=1))
    prompt = str(server.requests[-1]["body"])
    assert "Seen 3 times in this run (compile_error)" in prompt and "undeclared identifier" in prompt


def test_lifecycle_hooks_feed_the_ensemble(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = script_responder([fenced(vecadd(16, 1))])
    ens = build_ensemble(config(server, mode="bandit"), manager=kf_plugin_manager, run_dir=tmp_path)
    [p] = ens.propose(request(n=1))
    hooks.candidate_evaluated(p.candidate, record(p.candidate, speedup=2.0), manager=kf_plugin_manager)
    assert ens.members[0].gain == pytest.approx(7.0)  # stage score 5 + speedup 2, over a parentless 0
    summary = RunSummary(
        run_id="run1", run_dir=str(tmp_path), stop_reason="budget", generations=1, evaluations=1
    )
    hooks.run_finished("run1", summary, manager=kf_plugin_manager)
    assert summary.extra["llm"]["calls"] == 1 and ens._observer_name is None


def test_parent_fitness_is_the_bandit_baseline(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = script_responder([fenced(vecadd(16, 2))])
    ens = build(config(server, mode="bandit"), kf_plugin_manager, tmp_path)
    parent_c = Candidate(source=vecadd(16, 1))
    parent = Attempt(candidate=parent_c, record=record(parent_c, speedup=1.5))
    [p] = ens.propose(request(n=1, parent=parent))
    assert p.candidate.parent_id == parent_c.content_hash
    ens.observe(p.candidate, record(p.candidate, speedup=2.0))
    assert ens.members[0].gain == pytest.approx(0.5)


def test_proposals_paid_for_survive_the_cap(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = lambda body: Reply(
        fenced(vecadd(len(server.requests), 1)), tokens_in=3000, tokens_out=500
    )
    ens = build(
        config(server, mode="sample", weights=(1, 1e-9), llm_tokens=12000), kf_plugin_manager, tmp_path
    )
    props = ens.propose(request(n=5))
    assert len(props) == 3 and ens.exhausted  # the fourth call did not fit; the three made are kept
    assert ens.propose(request(n=1, generation=1)) == []
    assert len(server.requests) == 3


def test_a_resumed_run_keeps_its_spend_numbering_and_prompts(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    server.openai.responder = lambda body: Reply(
        fenced(vecadd(len(server.requests), 1)), tokens_in=3000, tokens_out=500
    )
    store = Store(tmp_path / "store.sqlite")
    cfg = config(server, mode="sample", weights=(1, 1e-9), llm_tokens=12000)
    first = build(cfg, kf_plugin_manager, tmp_path, store)
    assert len(first.propose(request(n=2))) == 2
    # the process dies; the run resumes with a new ensemble over the same store
    again = build(cfg, kf_plugin_manager, tmp_path, store)
    assert again.ledger.total.tokens == 7000 and again.ledger.total.calls == 2
    assert len(again.propose(request(n=2, generation=1))) == 1  # only one more call fits under the cap
    assert again.prompts is not None and first.prompts is not None
    assert {v.id: v.uses for v in again.prompts.variants.values()} == {
        v.id: v.uses + 1 for v in first.prompts.variants.values()
    }
    seqs = [r["seq"] for r in store.query("SELECT seq FROM llm_calls ORDER BY id")]
    # what the run had proposed and evaluated before is remembered after the resume
    old = Candidate(source=vecadd(999, 9))
    store.save_candidate(old, run_id="run1")
    rec = record(old, Outcome.compile_error)
    store.save_evaluation(rec.model_copy(update={"log": "x.cl:1:1: error: boom"}), run_id="run1")
    third = build(cfg, kf_plugin_manager, tmp_path, store)
    assert third.novelty is not None and vecadd(999, 9) in third.novelty
    assert third.prompts is not None and sum(third.prompts.errors.counts.values()) == 1
    assert seqs == [1, 2, 3, 4]  # three calls and the refusal, numbered on from before
    store.close()


def test_offline_generator_votes_alongside_a_model(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:
    from kfoundry.core.problem import load_problem

    root = Path(__file__).parents[1]
    problem = load_problem(root / "examples/kernelbench/vector_add.py", {"N": 4096})
    server.openai.responder = script_responder([fenced(vecadd(64, 3))], ranking="1 > 2 > 3 > 4")
    cfg = RunConfig.model_validate(
        {
            "llms": [
                {
                    "name": "openai",
                    "model": "gpt-test",
                    "options": {"api_key_env": "KF_TEST_KEY", "base_url": server.openai_url, "timeout": 5.0},
                },
                {"name": "offline"},
            ],
            "ensemble": {"mode": "vote", "keep": 2},
        }
    )
    store = Store(tmp_path / "store.sqlite")
    ens = build(cfg, kf_plugin_manager, tmp_path, store)
    req = GenerationRequest(
        problem=problem.summary(),
        language="opencl",
        device=DeviceProfile(backend="opencl", name="pocl", device_type="cpu"),
        n=4,
    )
    kept = ens.propose(req)
    assert len(kept) == 2
    [vote] = store.query("SELECT * FROM llm_votes")
    scores = json.loads(vote["scores"])
    assert set(scores) == {"openai:gpt-test", "offline"} and all(s is not None for s in scores.values())
    assert {g for g, _ in json.loads(vote["proposals"])} == {"openai:gpt-test", "offline"}
    store.close()


def test_missing_key_fails_when_the_ensemble_is_built(
    server: LLMServer, kf_plugin_manager: PluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KF_TEST_KEY")
    with pytest.raises(ConfigError, match="llm openai:gpt-test: environment variable KF_TEST_KEY is not set"):
        build(config(server), kf_plugin_manager, tmp_path)
    assert server.requests == []
