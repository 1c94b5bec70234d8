"""A recorded ensemble replays bit-for-bit with the ``replay`` provider, without any server."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_server import LLMServer, Status, fenced, script_responder, vecadd

from kfoundry.core.config import RunConfig
from kfoundry.core.ensemble import Ensemble, build_ensemble, replay_config
from kfoundry.core.generator import Attempt, GenerationRequest, ProblemSummary
from kfoundry.core.models import DeviceProfile, EvalRecord, Outcome, Proposal
from kfoundry.core.plugins import PluginManager
from kfoundry.plugins.llms.replay import ReplayMiss

KEY = "sk-replay-0a9b8c7d6e5f"


def request(generation: int, parent: Attempt | None) -> GenerationRequest:
    return GenerationRequest(
        problem=ProblemSummary(name="vadd", reference_source="class Model: ...", shapes={"N": 4096}),
        language="opencl",
        device=DeviceProfile(backend="opencl", name="pocl", device_type="cpu"),
        n=4,
        generation=generation,
        parent=parent,
        mode="improve" if parent else "create",
    )


def drive(ens: Ensemble, generations: int = 4) -> list[Proposal]:
    """A miniature search: each generation improves the newest valid proposal; stops at the cap."""
    out: list[Proposal] = []
    parent: Attempt | None = None
    for g in range(generations):
        props = ens.propose(request(g, parent))
        if not props:
            break
        out += props
        for p in props:
            if p.candidate is not None:
                rec = EvalRecord(
                    candidate_hash=p.candidate.content_hash,
                    eval_key="k",
                    problem="vadd",
                    backend="opencl",
                    device="pocl",
                    outcome=Outcome.correct,
                    speedup=1.0 + g,
                )
                ens.observe(p.candidate, rec)
                parent = Attempt(candidate=p.candidate, record=rec)
        ens.end_generation(g)
    return out


def fingerprint(props: list[Proposal]) -> list[tuple]:
    return [
        (
            p.generator,
            p.candidate.source if p.candidate else None,
            p.parse_error,
            p.prompt_id,
            p.tokens_in,
            p.tokens_out,
            p.cost_usd,
            p.candidate.parent_id if p.candidate else None,
        )
        for p in props
    ]


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kf_plugin_manager: PluginManager):  # noqa: ANN201
    monkeypatch.setenv("KF_TEST_KEY", KEY)
    opts = {
        "api_key_env": "KF_TEST_KEY",
        "max_retries": 2,
        "price": {"input_per_mtok": 3, "output_per_mtok": 15},
    }
    with LLMServer(key=KEY) as srv:
        cfg = RunConfig.model_validate(
            {
                "llms": [
                    {"name": "openai", "model": "gpt-x", "options": {**opts, "base_url": srv.openai_url}},
                    {
                        "name": "anthropic",
                        "model": "claude-y",
                        "options": {**opts, "base_url": srv.anthropic_url},
                    },
                ],
                "ensemble": {"mode": "vote", "keep": 2, "meta_every": 2},
                "budget": {"llm_cost_usd": 0.25},
            }
        )
        srv.openai.responder = script_responder([fenced(vecadd(b, 1)) for b in range(8, 200)] + ["garbage"])
        srv.anthropic.responder = script_responder(
            [fenced(vecadd(b, 2)) for b in range(8, 200)], ranking="2 > 1"
        )
        srv.openai.push(Status(429, retry_after=0.01))
        srv.anthropic.push(Status(500))
        ens = build_ensemble(cfg, manager=kf_plugin_manager, run_dir=tmp_path / "run", attach=False)
        for m in ens.members:
            m.generator.retry.sleep = lambda s: None
        props = drive(ens, generations=12)
        calls = len(srv.requests)
    return cfg, props, calls, ens


def test_replay_reproduces_every_proposal_and_stops_at_the_same_call(
    recorded,
    kf_plugin_manager: PluginManager,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    cfg, original, calls, ens = recorded
    assert ens.exhausted and calls > 8  # the money cap ended the recorded run
    again = build_ensemble(
        replay_config(cfg, tmp_path / "run", kf_plugin_manager),
        manager=kf_plugin_manager,
        run_dir=tmp_path / "replayed",
        attach=False,
    )
    replayed = drive(again, generations=12)
    assert fingerprint(replayed) == fingerprint(original)
    assert again.ledger.total == ens.ledger.total
    assert again.exhausted
    assert [m.name for m in again.members] == ["openai:gpt-x", "anthropic:claude-y"]
    # the replayed run records the same replies again
    a = (tmp_path / "run" / "llm_calls.jsonl").read_text().count("\n")
    b = (tmp_path / "replayed" / "llm_calls.jsonl").read_text().count("\n")
    assert a == b


def test_replay_of_a_different_run_misses_loudly(
    recorded, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:  # noqa: ANN001
    cfg, *_ = recorded
    again = build_ensemble(
        replay_config(cfg, tmp_path / "run", kf_plugin_manager), manager=kf_plugin_manager, attach=False
    )
    other = request(0, None).model_copy(update={"generation": 99})
    with pytest.raises(ReplayMiss, match="not in the recording"):
        again.propose(other)


def test_replay_needs_a_member_when_several_were_recorded(
    recorded, kf_plugin_manager: PluginManager, tmp_path: Path
) -> None:  # noqa: ANN001
    with pytest.raises(Exception, match="choose options.member among the recorded members"):
        kf_plugin_manager.get("llm", "replay").build({"recording": str(tmp_path / "run")})
    with pytest.raises(Exception, match="no recording at"):
        kf_plugin_manager.get("llm", "replay").build({"recording": str(tmp_path / "nothing")})
