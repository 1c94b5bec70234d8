"""Generator calls of a generation go out together: the per-provider limit holds, and the token and
cost caps are never exceeded however many calls are in flight (the loopback server counts the truth)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from llm_server import Action, LLMServer, Reply, Slow, fenced, vecadd

from kfoundry.core.config import load_config
from kfoundry.core.ensemble import build_ensemble
from kfoundry.core.generator import GenerationRequest, ProblemSummary
from kfoundry.core.llm.cost import LLMBudgetExhausted
from kfoundry.core.loop import propose_together
from kfoundry.core.models import DeviceProfile

REFERENCE = (
    "import torch\nclass Model(torch.nn.Module):\n    def forward(self, a, b):\n        return a + b\n"
)


def requests(n: int) -> list[GenerationRequest]:
    summary = ProblemSummary(name="vadd", reference_source=REFERENCE, shapes={"N": 4096})
    device = DeviceProfile(backend="opencl", name="pocl", device_type="cpu", peak_bandwidth_gbs=20.0)
    return [
        GenerationRequest(problem=summary, language="opencl", device=device, n=1, extra={"index": i})
        for i in range(n)
    ]


class InFlight:
    """Counts a provider's requests in flight (wraps its ``_complete``); the server holds each reply
    ``delay`` s (outside its lock: ``Slow``)."""

    def __init__(self, srv: LLMServer, provider: Any, delay: float) -> None:
        self.now, self.peak, self.i, self.lock = 0, 0, 0, threading.Lock()
        self.arrivals: list[float] = []
        srv.openai.responder = self.respond
        self.delay, inner = delay, provider._complete

        def counted(*args: Any) -> Any:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            try:
                return inner(*args)
            finally:
                with self.lock:
                    self.now -= 1

        provider._complete = counted

    def respond(self, body: dict[str, Any]) -> Action:
        self.arrivals.append(time.monotonic())
        self.i += 1  # called under the server's lock
        return Slow(self.delay, Reply(fenced(vecadd(block=64, work=self.i))))


def ensemble(srv: LLMServer, tmp: Any, concurrency: int, **budget: Any) -> Any:
    config = load_config(
        data={
            "output_dir": str(tmp),
            "llms": [
                {
                    "name": "openai",
                    "model": "gpt-test",
                    "options": {
                        "base_url": srv.openai_url,
                        "api_key_env": "",
                        "concurrency": concurrency,
                        "max_retries": 0,
                        "max_tokens": 400,
                        "price": {"input_per_mtok": 1.0, "output_per_mtok": 4.0},
                    },
                }
            ],
            "ensemble": {"novelty": False},
            "budget": budget,
        },
        validate_plugins=False,
    )
    return build_ensemble(config, None, run_dir=tmp, attach=False)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def test_calls_overlap_up_to_the_provider_limit(tmp_path: Any) -> None:
    with LLMServer() as srv:
        gen = ensemble(srv, tmp_path, concurrency=3)
        responder = InFlight(srv, gen.members[0].generator, 0.4)
        assert gen.concurrency == 3
        propose_together(gen, requests(1), limit=1)  # the first call pays for the SDK's start-up
        answers, wall = timed(lambda: propose_together(gen, requests(6), limit=8))
    assert all(isinstance(a, list) and len(a) == 1 and a[0].candidate is not None for a in answers)
    assert responder.peak == 3  # never more than the provider's limit, though 8 threads asked
    assert wall < 6 * 0.4 * 0.75  # and they did overlap: two waves of three, not six calls in a row


@pytest.mark.parametrize("cap", [{"llm_tokens": 9000}, {"llm_cost_usd": 0.02}])
def test_caps_are_never_exceeded_with_concurrent_calls(tmp_path: Any, cap: dict[str, Any]) -> None:
    with LLMServer() as srv:
        gen = ensemble(srv, tmp_path, concurrency=8, **cap)
        responder = InFlight(srv, gen.members[0].generator, 0.05)
        answers = propose_together(gen, requests(40), limit=16)
        served = list(srv.served)
    done = [a for a in answers if isinstance(a, list) and a]
    refused = [a for a in answers if isinstance(a, LLMBudgetExhausted) or a == []]
    assert done and refused  # the cap cut the batch somewhere in the middle
    assert responder.peak > 1  # calls really were in flight together
    ledger = gen.ledger
    assert ledger.total.calls == len(served)
    true_tokens = sum(a + b for a, b in served)  # what the server counted, not our estimate
    true_cost = sum(a * 1.0 / 1e6 + b * 4.0 / 1e6 for a, b in served)
    if "llm_tokens" in cap:
        assert ledger.total.tokens <= cap["llm_tokens"] and true_tokens <= cap["llm_tokens"]
    else:
        assert ledger.total.cost_usd <= cap["llm_cost_usd"] + 1e-12 and true_cost <= cap["llm_cost_usd"]
    assert ledger.remaining_tokens() in (None, cap.get("llm_tokens", 0) - ledger.total.tokens)  # all settled


@pytest.mark.slow
def test_kf_run_sends_a_generations_requests_together(tmp_path: Any) -> None:
    """The whole loop: seeds and proposals go out concurrently, every proposal is evaluated and stored."""
    import json
    import sqlite3
    import subprocess
    import sys

    import tomli_w
    from eval_helpers import EXAMPLES

    with LLMServer() as srv:
        gen = ensemble(srv, tmp_path, concurrency=4)  # for the responder's call counter only
        responder = InFlight(srv, gen.members[0].generator, 0.5)
        cfg = {
            "output_dir": str(tmp_path / "runs"),
            "llms": [
                {
                    "name": "openai",
                    "model": "gpt-test",
                    "options": {
                        "base_url": srv.openai_url,
                        "api_key_env": "",
                        "concurrency": 4,
                        "max_tokens": 1000,
                    },
                }
            ],
            "tuner": {"every": -1},
            "budget": {"generations": 2, "proposals_per_generation": 3},
            "evaluation": {
                "trials": 1,
                "warmup_s": 0.0,
                "min_repeats": 3,
                "max_repeats": 5,
                "target_time_s": 0.005,
                "rotate_bytes": 0,
                "correctness_budget_s": 0.0,
            },
        }
        path = tmp_path / "run.toml"
        path.write_bytes(tomli_w.dumps(cfg).encode())
        code = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
        args = [str(EXAMPLES / "kernelbench" / "vector_add.py"), "--config", str(path), "--shape", "N=1024"]
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=900
        )
        served = len(srv.served)
    assert done.returncode == 0, done.stderr[-3000:]
    assert responder.i == served >= 4  # seeds and proposals, all through the server
    gaps = [b - a for a, b in zip(responder.arrivals, responder.arrivals[1:], strict=False)]
    assert min(gaps) < 0.25  # a request arrived while another was still held (0.5 s): they overlapped
    [db_path] = list((tmp_path / "runs").glob("*/kfoundry.db"))
    db = sqlite3.connect(db_path)
    rows = db.execute("SELECT generation, record FROM loop_proposals").fetchall()
    assert {g for g, _ in rows} == {0, 1} and all(r for _, r in rows)
    assert all(json.loads(r)["outcome"] for _, r in rows)
    calls = db.execute("SELECT COUNT(*) FROM llm_calls WHERE error_kind IS NULL").fetchone()[0]
    assert calls == served
