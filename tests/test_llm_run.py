"""End to end: ``kf-run`` with a two-provider vote ensemble (openai + anthropic wire formats, served
by the local scripted server) on a real OpenCL problem; then the same run replayed without a server."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from llm_server import LLMServer, Slow, Status, evolving_responder

ROOT = Path(__file__).parents[1]
KEY = "sk-e2e-4c1f8a7d2b9e6035aa"
CAP = 60000

pytestmark = pytest.mark.slow


def run_config(tmp: Path, llms: list[dict[str, Any]], out: str) -> Path:
    cfg = {
        "output_dir": str(tmp / out),
        "seed": 3,
        "llms": llms,
        "ensemble": {"mode": "vote", "keep": 2, "meta_every": 2},
        "tuner": {"every": -1},
        "budget": {"generations": 8, "proposals_per_generation": 2, "llm_tokens": CAP},
        "evaluation": {
            "trials": 2,
            "warmup_s": 0.0,
            "min_repeats": 3,
            "max_repeats": 5,
            "target_time_s": 0.02,
            "rotate_bytes": 0,
            "timeout_s": 60,
        },
    }
    path = tmp / f"{out}.toml"
    path.write_bytes(tomli_w.dumps(cfg).encode())
    return path


def kf_run(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``kf-run vector_add.py --config CONFIG --shape N=4096`` in a fresh process."""
    code = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
    args = [str(ROOT / "examples/kernelbench/vector_add.py"), "--config", str(config), "--shape", "N=4096"]
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=900, cwd=ROOT
    )


def db(run_root: Path) -> sqlite3.Connection:
    [run_dir] = list(run_root.iterdir())
    conn = sqlite3.connect(run_dir / "kfoundry.db")
    conn.row_factory = sqlite3.Row
    return conn


def proposals(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in conn.execute(
            "SELECT generation, idx, generator, candidate_hash, parse_error, json_extract(record, '$.outcome'), "
            "json_extract(record, '$.speedup'), json_extract(candidate, '$.prompt_id') "
            "FROM loop_proposals ORDER BY generation, idx"
        )
    ]


def test_vote_ensemble_run_records_everything_stops_at_the_cap_and_replays(tmp_path: Path) -> None:
    env = {**os.environ, "KF_E2E_KEY": KEY, "PYTHONPATH": str(ROOT)}
    # one call at a time: the order of calls around the cap, and so the replay's, is then exact
    # (concurrent calls keep the cap too: tests/test_concurrency_llm.py)
    common = {
        "api_key_env": "KF_E2E_KEY",
        "max_retries": 3,
        "timeout": 3.0,
        "max_tokens": 2000,
        "concurrency": 1,
        "price": {"input_per_mtok": 1.0, "output_per_mtok": 4.0},
    }
    with LLMServer(key=KEY) as srv:
        srv.openai.responder = evolving_responder(0)
        srv.anthropic.responder = evolving_responder(1)
        srv.openai.push(Status(429, retry_after=0.05), Slow(4.0))  # a rate limit, then a reply too slow
        srv.anthropic.push(Status(529), Status(500))
        llms = [
            {"name": "openai", "model": "gpt-e2e", "options": {**common, "base_url": srv.openai_url}},
            {
                "name": "anthropic",
                "model": "claude-e2e",
                "options": {**common, "base_url": srv.anthropic_url},
            },
        ]
        done = kf_run(run_config(tmp_path, llms, "live"), env)
        requests = len(srv.requests)
    assert done.returncode == 0, done.stderr[-3000:]
    conn = db(tmp_path / "live")
    calls = conn.execute("SELECT * FROM llm_calls ORDER BY seq").fetchall()
    sent = [c for c in calls if c["error_kind"] != "budget"]
    # every HTTP request is accounted for (retries included), and every call kept its prompt and reply
    assert sum(c["attempts"] for c in sent) == requests
    assert {c["kind"] for c in sent} == {"generate", "rank", "meta"}
    assert {c["member"] for c in sent} == {"openai:gpt-e2e", "anthropic:claude-e2e"}
    for c in sent:
        assert c["prompt"] and c["system"] and c["response"] and c["tokens_in"] > 0 and c["tokens_out"] > 0
        assert c["cost_usd"] == pytest.approx((c["tokens_in"] * 1.0 + c["tokens_out"] * 4.0) / 1e6)
    # the token cap stopped the run: never exceeded, and the refused call did not fit
    used = sum(c["tokens_in"] + c["tokens_out"] for c in sent)
    [refused] = [c for c in calls if c["error_kind"] == "budget"]
    assert used <= CAP < used + json.loads(refused["data"])["max_tokens"] + 16
    assert calls[-1]["error_kind"] == "budget"  # nothing was asked after the refusal
    # the kernels the models wrote were compiled, checked and timed on the real device
    rows = proposals(conn)
    outcomes = {r[5] for r in rows if r[2] != "seed"}
    assert "correct" in outcomes and "parse_error" in outcomes
    assert {r[2] for r in rows} >= {"seed", "openai:gpt-e2e", "anthropic:claude-e2e"}
    assert conn.execute("SELECT COUNT(*) FROM llm_votes").fetchone()[0] >= 1
    vias = {r[0] for r in conn.execute("SELECT json_extract(candidate, '$.meta.via') FROM loop_proposals")}
    assert {"block", "diff"} <= vias  # full kernels and SEARCH/REPLACE diffs on parents both made it
    # meta-prompt evolution: the base prompt plus one variant per answered meta call (how many generations
    # fit under the token cap depends on which parents the timings pick, so the count is not fixed)
    metas = [c for c in sent if c["kind"] == "meta" and c["error_kind"] is None]
    assert metas
    variants = conn.execute("SELECT parent_id, section FROM prompts ORDER BY rowid").fetchall()
    assert len(variants) == 1 + len(metas)
    assert variants[0]["parent_id"] is None and all(v["parent_id"] and v["section"] for v in variants[1:])
    status, summary = conn.execute("SELECT status, summary FROM runs").fetchone()
    assert status == "finished" and "LLM budget" in json.loads(summary)["stop_reason"]
    # no key anywhere: store, recording, exported kernel, run file, logs, terminal output
    run_dir = next((tmp_path / "live").iterdir())
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f
    assert KEY not in done.stdout + done.stderr
    assert f"{len(sent)} calls, {used} tokens" in done.stdout and "LLM budget exhausted" in done.stdout

    # replay: `kf-run replay RUN_DIR` serves every model reply from the recording, with no server and no key
    code = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
    again = subprocess.run(
        [sys.executable, "-c", code, "replay", str(run_dir)],
        env={**env, "KF_E2E_KEY": ""},
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "recorded evaluations reused" in again.stdout
    [replay_dir] = [d for d in (tmp_path / "live").iterdir() if d != run_dir]
    conn2 = sqlite3.connect(replay_dir / "kfoundry.db")
    conn2.row_factory = sqlite3.Row
    assert proposals(conn2) == rows
    calls2 = conn2.execute(
        "SELECT member, kind, request_key, response, tokens_in, tokens_out, cost_usd, error_kind "
        "FROM llm_calls ORDER BY seq"
    ).fetchall()
    assert [tuple(c) for c in calls2] == [
        (
            c["member"],
            c["kind"],
            c["request_key"],
            c["response"],
            c["tokens_in"],
            c["tokens_out"],
            c["cost_usd"],
            c["error_kind"],
        )
        for c in calls
    ]
    json.loads((run_dir / "run.json").read_text())  # the live run folder stays intact

    # kf-run llm-calls lists the calls with their spend, and shows one call's prompt and reply
    listing = subprocess.run(
        [sys.executable, "-c", code, "llm-calls", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**env, "COLUMNS": "160"},
    )
    assert listing.returncode == 0 and f"{len(calls)} language-model calls" in listing.stdout
    assert "openai:gpt-e2e" in listing.stdout and "budget" in listing.stdout


def test_a_rejected_key_ends_the_run_in_one_line_without_the_key(tmp_path: Path) -> None:
    wrong = "sk-wrong-9f8e7d6c5b4a"
    with LLMServer(key=KEY) as srv:
        llms = [
            {
                "name": "openai",
                "model": "gpt-e2e",
                "options": {"api_key_env": "KF_E2E_KEY", "base_url": srv.openai_url, "max_retries": 3},
            }
        ]
        done = kf_run(
            run_config(tmp_path, llms, "denied"), {**os.environ, "KF_E2E_KEY": wrong, "PYTHONPATH": str(ROOT)}
        )
        assert len(srv.requests) == 1  # a 401 is not retried
    assert done.returncode == 2
    lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert lines == ["error: llm openai:gpt-e2e: HTTP 401: invalid api key"], done.stderr[-2000:]
    assert wrong not in done.stdout + done.stderr
