"""The openai and anthropic providers through the official SDKs against a local scripted server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_server import Garbage, LLMServer, Reply, Slow, Status, fenced, vecadd

from kfoundry.core.generator import GenerationRequest, ProblemSummary
from kfoundry.core.llm.cost import CostLedger, LLMBudgetExhausted, Price, estimate_tokens
from kfoundry.core.llm.provider import LLMError, LLMProvider
from kfoundry.core.llm.recording import Recorder, load_recording
from kfoundry.core.models import DeviceProfile
from kfoundry.core.store import Store
from kfoundry.plugins.llms.anthropic_provider import AnthropicOptions, AnthropicProvider
from kfoundry.plugins.llms.openai_provider import OpenAIOptions, OpenAIProvider

KEY = "sk-kftest-7f3a9c2e5b1d4f60"
REFERENCE = (
    "import torch\nclass Model(torch.nn.Module):\n    def forward(self, a, b):\n        return a + b\n"
)


def request(n: int = 1) -> GenerationRequest:
    return GenerationRequest(
        problem=ProblemSummary(name="vadd", reference_source=REFERENCE, shapes={"N": 4096}),
        language="opencl",
        device=DeviceProfile(backend="opencl", name="pocl", device_type="cpu", peak_bandwidth_gbs=20.0),
        n=n,
    )


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMServer]:
    monkeypatch.setenv("KF_TEST_KEY", KEY)
    with LLMServer(key=KEY) as srv:
        yield srv


def make(api: str, srv: LLMServer, tmp_path: Path, **opts: object) -> LLMProvider:
    common = {"api_key_env": "KF_TEST_KEY", "timeout": 2.0, "max_retries": 3, **opts}
    if api == "openai":
        p: LLMProvider = OpenAIProvider(OpenAIOptions(base_url=srv.openai_url, **common))
    else:
        p = AnthropicProvider(AnthropicOptions(base_url=srv.anthropic_url, **common))
    p.configure(model=f"{api}-model", recorder=Recorder(path=tmp_path / "calls.jsonl"))
    p.retry.base_delay = 0.01
    return p


def route(srv: LLMServer, api: str):  # noqa: ANN201
    return srv.openai if api == "openai" else srv.anthropic


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_reply_becomes_a_candidate_with_usage_cost_and_record(
    api: str, server: LLMServer, tmp_path: Path
) -> None:
    route(server, api).push(Reply(fenced(vecadd(128, 2)), tokens_in=1000, tokens_out=200))
    p = make(api, server, tmp_path, price=Price(input_per_mtok=2.0, output_per_mtok=10.0))
    [prop] = p.propose(request())
    assert prop.candidate is not None and prop.parse_error is None
    assert prop.candidate.params == {"BLOCK": 128, "WORK": 2}
    assert prop.candidate.generator == p.name and prop.candidate.language == "opencl"
    assert (prop.tokens_in, prop.tokens_out) == (1000, 200)
    assert prop.cost_usd == pytest.approx(1000 * 2e-6 + 200 * 10e-6)
    body = server.calls(api)[0]["body"]
    assert body["model"] == f"{api}-model"
    assert "kfoundry.runtime" in json.dumps(body)  # the prompt teaches the runtime
    [call] = load_recording(tmp_path / "calls.jsonl")
    assert (
        call.response == fenced(vecadd(128, 2)) and call.tokens_in == 1000 and call.cost_usd == prop.cost_usd
    )


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_retries_429_with_retry_after_500_and_garbage_then_succeeds(
    api: str, server: LLMServer, tmp_path: Path
) -> None:
    route(server, api).push(Status(429, retry_after=0.05), Status(500), Garbage(), Reply(fenced(vecadd())))
    p = make(api, server, tmp_path)
    waits: list[float] = []
    p.retry.sleep = waits.append
    [prop] = p.propose(request())
    assert prop.candidate is not None
    assert len(server.calls(api)) == 4
    assert waits[0] == pytest.approx(0.05)  # Retry-After honoured
    [call] = load_recording(tmp_path / "calls.jsonl")
    assert call.attempts == 4 and call.error is None


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_non_json_content_type_is_retried_not_returned_as_str(
    api: str, server: LLMServer, tmp_path: Path
) -> None:
    route(server, api).push(Garbage("plain text body", content_type="text/plain"), Reply(fenced(vecadd())))
    [prop] = make(api, server, tmp_path).propose(request())
    assert prop.candidate is not None and len(server.calls(api)) == 2


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_slow_response_times_out_and_is_retried(api: str, server: LLMServer, tmp_path: Path) -> None:
    route(server, api).push(Slow(1.5, Reply("late")), Reply(fenced(vecadd())))
    p = make(api, server, tmp_path, timeout=0.5)
    [prop] = p.propose(request())
    assert prop.candidate is not None
    calls = load_recording(tmp_path / "calls.jsonl")
    assert calls[0].attempts == 2


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_exhausted_retries_yield_no_proposal_and_a_recorded_error(
    api: str, server: LLMServer, tmp_path: Path
) -> None:
    route(server, api).push(*[Status(503)] * 3)
    p = make(api, server, tmp_path, max_retries=2)
    assert p.propose(request()) == []
    [call] = load_recording(tmp_path / "calls.jsonl")
    assert call.error_kind == "transient" and call.attempts == 3 and "503" in (call.error or "")
    assert p.ledger.total.tokens == 0  # nothing charged for a failed call


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_bad_key_is_one_fatal_line_without_the_key(
    api: str, server: LLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_TEST_KEY", "sk-wrong-key-0000")
    p = make(api, server, tmp_path)
    with pytest.raises(LLMError) as err:
        p.propose(request())
    assert "401" in str(err.value) and "\n" not in str(err.value)
    assert "sk-wrong-key-0000" not in str(err.value)
    assert len(server.calls(api)) == 1  # a 401 is not retried


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_refused_request_is_skipped_not_fatal(api: str, server: LLMServer, tmp_path: Path) -> None:
    route(server, api).push(Status(400, "prompt too long"), Reply(fenced(vecadd())))
    p = make(api, server, tmp_path)
    props = p.propose(request(n=2))
    assert len(props) == 1 and props[0].candidate is not None
    assert load_recording(tmp_path / "calls.jsonl")[0].error_kind == "refused"


def test_missing_key_variable_is_a_config_error(
    server: LLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KF_TEST_KEY")
    with pytest.raises(Exception, match="environment variable KF_TEST_KEY is not set"):
        make("openai", server, tmp_path).propose(request())


def test_garbage_reply_is_a_parse_error_proposal_and_next_prompt_says_why(
    server: LLMServer, tmp_path: Path
) -> None:
    server.openai.push(Reply("Sorry, here is my idea in words only."), Reply(fenced(vecadd())))
    p = make("openai", server, tmp_path)
    [bad] = p.propose(request())
    assert bad.candidate is None and "no fenced code block" in (bad.parse_error or "")
    p.propose(request())
    second_prompt = server.calls("openai")[1]["body"]["messages"][1]["content"]
    assert "## Your previous reply" in second_prompt and "no fenced code block" in second_prompt


def test_openai_usage_missing_is_estimated(server: LLMServer, tmp_path: Path) -> None:
    server.openai.push(Reply(fenced(vecadd()), usage=False))
    [prop] = make("openai", server, tmp_path).propose(request())
    assert prop.tokens_out > 0


def test_token_cap_clamps_max_tokens_then_refuses_before_calling(server: LLMServer, tmp_path: Path) -> None:
    p = make("openai", server, tmp_path, max_tokens=4000)
    prompt_tokens = p.prompt_estimate(p.builder.generation(request()))
    p.configure(ledger=CostLedger(max_tokens=prompt_tokens + 1500))
    server.openai.push(Reply(fenced(vecadd()), tokens_in=prompt_tokens - 200, tokens_out=300))
    p.propose(request())
    sent = server.calls("openai")[0]["body"]["max_tokens"]
    assert sent == 1500  # clamped to what the cap leaves, not the configured 4000
    with pytest.raises(LLMBudgetExhausted):
        p.propose(request())
    assert len(server.calls("openai")) == 1  # refused before any HTTP request
    assert p.ledger.total.tokens <= prompt_tokens + 1500


def test_money_cap(server: LLMServer, tmp_path: Path) -> None:
    price = Price(input_per_mtok=1000.0, output_per_mtok=1000.0)  # $0.001 per token
    p = make("anthropic", server, tmp_path, price=price, max_tokens=100)
    p.configure(ledger=CostLedger(max_cost_usd=5.0))
    server.anthropic.push(*[Reply(fenced(vecadd()), tokens_in=2000, tokens_out=100)] * 5)
    p.propose(request())
    assert p.ledger.total.cost_usd == pytest.approx(2.1)
    p.propose(request())
    with pytest.raises(LLMBudgetExhausted, match=r"\$4.2000 of \$5.0000"):
        p.propose(request())
    assert len(server.calls("anthropic")) == 2


def test_key_never_reaches_store_recording_or_errors(server: LLMServer, tmp_path: Path) -> None:
    store = Store(tmp_path / "store.sqlite")
    rec = Recorder(store, tmp_path / "calls.jsonl", run_id="r1")
    server.openai.push(
        Reply(f"{KEY} echoed back by a hostile server?\n" + fenced(vecadd())), Status(500, f"bad {KEY}")
    )
    server.openai.push(Status(500), Status(500), Status(500))
    p = make("openai", server, tmp_path, max_retries=0)
    p.configure(recorder=rec)
    p.propose(request())
    p.propose(request())
    # the key was really sent ...
    assert server.calls("openai")[0]["headers"]["authorization"] == f"Bearer {KEY}"
    rows = store.query("SELECT * FROM llm_calls")
    assert len(rows) == 2 and rows[1]["error"] and KEY not in rows[1]["error"]
    store.close()
    # ... and appears nowhere we wrote, not even where a hostile server echoed it
    for f in tmp_path.iterdir():
        assert KEY.encode() not in f.read_bytes(), f.name


def test_local_server_without_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with LLMServer() as srv:
        srv.openai.push(Reply(fenced(vecadd())))
        p = OpenAIProvider(OpenAIOptions(base_url=srv.openai_url, api_key_env="", timeout=2.0))
        [prop] = p.propose(request())
        assert prop.candidate is not None
        assert srv.calls("openai")[0]["body"]["max_tokens"] == 8192  # local servers get max_tokens


def test_anthropic_large_max_tokens_without_streaming(server: LLMServer, tmp_path: Path) -> None:
    server.anthropic.push(Reply(fenced(vecadd())))
    [prop] = make("anthropic", server, tmp_path, max_tokens=64000).propose(request())
    assert prop.candidate is not None  # the SDK's long-request guard is satisfied by the explicit timeout
    assert server.calls("anthropic")[0]["body"]["max_tokens"] == 64000


def test_denser_prompts_than_assumed_tighten_the_estimate(server: LLMServer, tmp_path: Path) -> None:
    p = make("openai", server, tmp_path, max_tokens=100)
    prompt = p.builder.generation(request())
    chars = len(prompt.system) + len(prompt.user)
    server.openai.push(Reply(fenced(vecadd()), tokens_in=chars // 2, tokens_out=50))  # 2 chars per token
    p.propose(request())
    assert p.ledger.chars_per_token == pytest.approx(0.9 * chars / (chars // 2))
    assert estimate_tokens("x" * 1800, p.ledger.chars_per_token) == 1000


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "body", ['{"foo": 1}', '{"choices": "x", "content": null, "usage": null}', "[1, 2]", '"text"']
)
def test_json_of_the_wrong_shape_is_retried(api: str, body: str, server: LLMServer, tmp_path: Path) -> None:
    route(server, api).push(Garbage(body), Reply(fenced(vecadd())))
    [prop] = make(api, server, tmp_path).propose(request())
    assert prop.candidate is not None and len(server.calls(api)) == 2
    assert load_recording(tmp_path / "calls.jsonl")[0].attempts == 2


def test_anthropic_marks_the_stable_prefix_for_its_prompt_cache(server: LLMServer, tmp_path: Path) -> None:
    server.anthropic.push(Reply(fenced(vecadd())), Reply(fenced(vecadd(32))))
    p = make("anthropic", server, tmp_path)
    p.propose(request())
    content = server.calls("anthropic")[0]["body"]["messages"][0]["content"]
    assert isinstance(content, list) and content[0]["cache_control"] == {"type": "ephemeral"}
    prompt = p.builder.generation(request())
    assert content[0]["text"] + content[1]["text"] == prompt.user
    off = make("anthropic", server, tmp_path, prompt_cache=False)
    off.propose(request())
    assert server.calls("anthropic")[1]["body"]["messages"][0]["content"] == prompt.user
