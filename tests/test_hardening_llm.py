"""The language-model client against a misbehaving server on 127.0.0.1: dead, killed, slow, no ``usage``,
a denser tokenizer, context-length refusals, a base URL without ``/v1``; caps, failure lines, options."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w
from llm_server import LLMServer, Reply, Slow, Status, fenced, free_port, vecadd

from kfoundry.core.config import load_config
from kfoundry.core.errors import ConfigError
from kfoundry.core.generator import Attempt, GenerationRequest, ProblemSummary
from kfoundry.core.llm.cost import (
    CONSERVATIVE_BYTES_PER_TOKEN,
    CostLedger,
    LLMBudgetExhausted,
    TokenCounter,
    tiktoken_encoding,
)
from kfoundry.core.llm.provider import (
    LLMError,
    LLMProvider,
    ModelUnreachable,
    check_base_url,
    context_refusal,
)
from kfoundry.core.llm.recording import Recorder, load_recording
from kfoundry.core.models import Candidate, DeviceProfile, EvalRecord, Outcome
from kfoundry.plugins.llms.anthropic_provider import AnthropicOptions, AnthropicProvider
from kfoundry.plugins.llms.openai_provider import OpenAIOptions, OpenAIProvider

KEY = "sk-kfharden-31c4e9a7b2d85f60"
REFERENCE = (
    "import torch\nclass Model(torch.nn.Module):\n    def forward(self, a, b):\n        return a + b\n"
)
APIS = ["openai", "anthropic"]


def request(n: int = 1, inspirations: int = 0) -> GenerationRequest:
    insp = [
        Attempt(
            candidate=Candidate(source=fenced(vecadd(32 * (i + 1))) * 3, language="opencl"),
            record=None,
        )
        for i in range(inspirations)
    ]
    return GenerationRequest(
        problem=ProblemSummary(name="vadd", reference_source=REFERENCE, shapes={"N": 4096}),
        language="opencl",
        device=DeviceProfile(backend="opencl", name="pocl", device_type="cpu", peak_bandwidth_gbs=20.0),
        n=n,
        inspirations=insp,
    )


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_TEST_KEY", KEY)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with LLMServer(key=KEY) as srv:
        yield srv


def make(api: str, url: str, tmp_path: Path, **opts: object) -> LLMProvider:
    common = {"api_key_env": "KF_TEST_KEY", "timeout": 2.0, "max_retries": 2, **opts}
    p: LLMProvider = (
        OpenAIProvider(OpenAIOptions(base_url=url, **common))  # type: ignore[arg-type]
        if api == "openai"
        else AnthropicProvider(AnthropicOptions(base_url=url, **common))  # type: ignore[arg-type]
    )
    p.configure(model=f"{api}-model", recorder=Recorder(path=tmp_path / "calls.jsonl"))
    p.retry.sleep = lambda s: None
    return p


def url_of(srv: LLMServer, api: str) -> str:
    return srv.openai_url if api == "openai" else srv.anthropic_url


def route(srv: LLMServer, api: str):  # noqa: ANN201
    return srv.openai if api == "openai" else srv.anthropic


# -- a server that is not there ---------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_never_started_server_is_one_line_naming_provider_url_and_error(api: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}" + ("/v1" if api == "openai" else "")
    p = make(api, url, tmp_path)
    with pytest.raises(ModelUnreachable) as err:
        p.propose(request(n=3))
    msg = str(err.value)
    assert "\n" not in msg and api in msg and f"127.0.0.1:{port}" in msg and "Connection refused" in msg, msg
    [call] = load_recording(tmp_path / "calls.jsonl")  # the first call stopped it: nothing more was asked
    assert call.error_kind == "unreachable" and call.attempts == 3
    assert p.ledger.failures["unreachable"] == 1 and p.ledger.total.failed == 1


@pytest.mark.parametrize("api", APIS)
def test_server_killed_mid_run(api: str, tmp_path: Path) -> None:
    srv = LLMServer(key=KEY).__enter__()
    route(srv, api).push(Reply(fenced(vecadd())))
    p = make(api, url_of(srv, api), tmp_path)
    [prop] = p.propose(request())
    assert prop.candidate is not None
    srv.kill()
    with pytest.raises(ModelUnreachable, match="cannot reach"):
        p.propose(request())


def test_slow_server_calls_time_out_are_logged_counted_then_stop_the_run(
    server: LLMServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.openai.responder = lambda body: Slow(1.0, Reply("late"))
    p = make("openai", server.openai_url, tmp_path, timeout=0.3, max_retries=0, max_failed_calls=3)
    caplog.set_level(logging.WARNING, logger="kfoundry.core.llm.provider")
    assert p.propose(request(n=2)) == []  # two failed calls: the run goes on
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("generate call failed (timed out, 1 attempts)" in x for x in lines), lines
    assert p.ledger.failures == {"timeout": 2}
    with pytest.raises(ModelUnreachable, match="answered none of the last 3 calls"):
        p.propose(request())
    kinds = [c.error_kind for c in load_recording(tmp_path / "calls.jsonl")]
    assert kinds == ["timeout", "timeout", "unreachable"]


def test_an_answer_resets_the_count_of_failed_calls(server: LLMServer, tmp_path: Path) -> None:
    server.openai.push(
        Status(503), Reply(fenced(vecadd())), Status(503), Status(503), Reply(fenced(vecadd()))
    )
    p = make("openai", server.openai_url, tmp_path, max_retries=0, max_failed_calls=3)
    props = p.propose(request(n=5))
    assert len(props) == 2  # 1 fail, ok, 2 fails, ok: never 3 in a row


@pytest.mark.parametrize("api", APIS)
def test_failed_and_refused_calls_print_one_line_each(
    api: str, server: LLMServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    route(server, api).push(Status(400, "bad request body"), Status(500), Status(500), Status(500))
    route(server, api).push(Reply(fenced(vecadd())))
    caplog.set_level(logging.WARNING, logger="kfoundry.core.llm.provider")
    p = make(api, url_of(server, api), tmp_path)
    assert len(p.propose(request(n=3))) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "(refused, 1 attempts): HTTP 400: bad request body" in lines[0]
    assert "(transient, 3 attempts)" in lines[1] and "HTTP 500" in lines[1]
    assert dict(p.ledger.failures) == {"refused": 1, "transient": 1}
    assert p.ledger.total.calls == 1 and p.ledger.total.failed == 2


# -- caps ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_token_cap_holds_with_a_server_that_sends_no_usage(api: str, tmp_path: Path) -> None:
    cap = 5000
    with LLMServer(key=KEY, usage=False) as srv:
        route(srv, api).responder = lambda body: Reply(fenced(vecadd()))
        p = make(api, url_of(srv, api), tmp_path, max_tokens=800)
        p.configure(ledger=CostLedger(max_tokens=cap))
        with pytest.raises(LLMBudgetExhausted):
            for _ in range(20):
                p.propose(request())
        assert len(srv.served) >= 1
        assert srv.served_tokens <= cap  # what the server really counted stayed under the cap
        assert p.ledger.total.tokens >= srv.served_tokens  # and we never counted less than it did
        assert p.ledger.total.tokens <= cap


@pytest.mark.parametrize("api", APIS)
def test_token_cap_holds_on_the_first_call_with_a_tokenizer_twice_as_dense(api: str, tmp_path: Path) -> None:
    probe = make(api, "http://127.0.0.1:9/v1" if api == "openai" else "http://127.0.0.1:9", tmp_path)
    prompt = probe.builder.generation(request())
    true_prompt = len(prompt.system + prompt.user) // 2 + 2
    cap = true_prompt + 300  # the prompt alone, as the server counts it, nearly fills the cap
    with LLMServer(key=KEY, chars_per_token=2.0) as srv:
        route(srv, api).responder = lambda body: Reply(fenced(vecadd()))
        p = make(api, url_of(srv, api), tmp_path, max_tokens=4000)
        p.configure(ledger=CostLedger(max_tokens=cap))
        with pytest.raises(LLMBudgetExhausted) as err:
            for _ in range(5):
                p.propose(request())
        assert srv.served_tokens <= cap, (srv.served, cap)
        assert p.ledger.total.tokens <= cap
        assert f"of {cap} tokens used" in str(err.value)


def test_a_prompt_larger_than_the_cap_is_never_sent(server: LLMServer, tmp_path: Path) -> None:
    p = make("openai", server.openai_url, tmp_path)
    p.configure(ledger=CostLedger(max_tokens=500))
    with pytest.raises(LLMBudgetExhausted):
        p.propose(request())
    assert server.requests == []


def test_the_first_served_prompt_teaches_the_density(server: LLMServer, tmp_path: Path) -> None:
    p = make("openai", server.openai_url, tmp_path, max_tokens=200)
    assert p.ledger.chars_per_token == CONSERVATIVE_BYTES_PER_TOKEN
    server.openai.push(Reply(fenced(vecadd())))
    p.propose(request())
    assert p.ledger.chars_per_token == pytest.approx(3.6, rel=0.02)  # 0.9 x the server's 4 per token


def _bytes_encoding():  # noqa: ANN202
    tiktoken = pytest.importorskip("tiktoken")
    return tiktoken.Encoding(
        name="bytes-test",
        pat_str=r"[\s\S]",
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={},
    )


def test_exact_local_count_wins_over_a_smaller_usage(server: LLMServer, tmp_path: Path) -> None:
    enc = _bytes_encoding()  # one token per byte: an exact tokenizer we can reason about
    p = make("openai", server.openai_url, tmp_path, max_tokens=4000)
    p._counter = TokenCounter(enc)
    prompt = p.builder.generation(request())
    exact = TokenCounter(enc).prompt([prompt.system, prompt.user])
    server.openai.push(Reply(fenced(vecadd()), tokens_in=exact // 2, tokens_out=5))  # under-reported
    [prop] = p.propose(request())
    assert prop.tokens_in == exact
    assert prop.tokens_out == len(fenced(vecadd()).encode())


def test_tiktoken_never_downloads_in_cached_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tiktoken")
    import requests

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("tiktoken tried the network")

    monkeypatch.setattr(requests, "get", no_network)
    tiktoken_encoding.cache_clear()
    try:
        assert tiktoken_encoding("gpt-4o-mini", "cached") is None  # not on this machine: estimate instead
        assert tiktoken_encoding("llama-3-70b", "cached") is None  # not an OpenAI model
        counter = TokenCounter.for_model("gpt-4o-mini")
        assert not counter.exact and counter.count("x" * 100) == 50
    finally:
        tiktoken_encoding.cache_clear()


# -- addresses --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("127.0.0.1:8000/v1", "must start with http:// or https://"),
        ("htp://127.0.0.1:8000/v1", "must start with http:// or https://"),
        ("http:/127.0.0.1:8000/v1", "has no host"),
        ("http://127.0.0.1:80000/v1", "not a valid URL"),
        ("http://[::1/v1", "not a valid URL"),
        ("http://127.0.0.1:8000/v1 ", "contain spaces"),
        ("", "must not be empty"),
    ],
)
def test_bad_base_url_is_a_one_line_config_error(url: str, why: str) -> None:
    data = {"llms": [{"name": "openai", "model": "m", "options": {"base_url": url}}]}
    with pytest.raises(ConfigError) as err:
        load_config(data=data)
    msg = str(err.value)
    assert "\n" not in msg and "llms[0].options.base_url" in msg and why in msg, msg


def test_good_base_urls_pass() -> None:
    for url in ("http://127.0.0.1:8000/v1", "https://api.example.org/openai/v1/", "http://[::1]:11434/v1"):
        assert check_base_url(url) == url


def test_base_url_without_v1_warns_at_config_load_and_404_says_why(server: LLMServer, tmp_path: Path) -> None:
    root = f"http://127.0.0.1:{server.port}"
    with pytest.warns(UserWarning, match=r"has no /v1.*did you mean http://127\.0\.0\.1:\d+/v1\?"):
        load_config(data={"llms": [{"name": "openai", "model": "m", "options": {"base_url": root}}]})
    with pytest.warns(UserWarning):
        p = make("openai", root, tmp_path)
    with pytest.raises(LLMError) as err:
        p.propose(request())
    msg = str(err.value)
    assert "HTTP 404" in msg and f"did you mean {root}/v1?" in msg and "\n" not in msg


def test_anthropic_base_url_with_v1_warns_and_404_says_why(server: LLMServer, tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="appends /v1/messages itself"):
        p = make("anthropic", server.anthropic_url + "/v1", tmp_path)
    with pytest.raises(LLMError, match=r"HTTP 404.*did you mean http://127\.0\.0\.1:\d+\?"):
        p.propose(request())


# -- context-length refusals -------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_context_refusal_shrinks_the_completion_limit_and_remembers_the_window(
    api: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = make(api, "http://127.0.0.1:9/v1" if api == "openai" else "http://127.0.0.1:9", tmp_path)
    prompt = probe.builder.generation(request())
    window = len(prompt.system + prompt.user) // 4 + 1500
    with LLMServer(key=KEY, context=window) as srv:
        route(srv, api).responder = lambda body: Reply(fenced(vecadd()))
        p = make(api, url_of(srv, api), tmp_path, max_tokens=8192)
        caplog.set_level(logging.WARNING, logger="kfoundry.core.llm.provider")
        props = p.propose(request(n=3))
        assert len(props) == 3 and all(x.candidate is not None for x in props)
        sent = [r["body"]["max_tokens"] for r in srv.calls(api)]
        assert sent[0] == 8192 and len(sent) == 4  # one refusal, then everything fits the window
        assert all(s <= window for s in sent[1:])
        assert p.context_window == window
        assert any(
            "maximum context length" in r.getMessage() or "context limit" in r.getMessage()
            for r in caplog.records
        )


def test_a_prompt_too_long_for_the_context_drops_inspirations_then_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with LLMServer(key=KEY, context=600) as srv:
        srv.openai.responder = lambda body: Reply(fenced(vecadd()))
        p = make("openai", srv.openai_url, tmp_path, max_tokens=4000)
        caplog.set_level(logging.WARNING, logger="kfoundry.core.llm.provider")
        assert p.propose(request(inspirations=2)) == []
        prompts = [r["body"]["messages"][1]["content"] for r in srv.calls("openai")]
        assert len(prompts) == 2 and len(prompts[1]) < len(prompts[0])  # asked again without inspirations
    kinds = [c.error_kind for c in load_recording(tmp_path / "calls.jsonl")]
    assert kinds == ["context", "context"]
    assert p.ledger.failures == {"context": 2}
    assert sum("too long for the model's context" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize(
    ("message", "limit", "prompt"),
    [
        (
            "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
            "(1000 in the messages, 8000 in the completion).",
            8192,
            1000,
        ),
        (
            "'max_tokens' is too large: 8000. This model's maximum context length is 4096 tokens and your "
            "request has 900 input tokens (8000 > 4096 - 900).",
            4096,
            900,
        ),
        (
            "input length and `max_tokens` exceed context limit: 7000 + 8192 > 8192, decrease input length",
            8192,
            7000,
        ),
        ("prompt is too long: 210000 tokens > 200000 maximum", 200000, 210000),
        (
            'the request exceeds the available context size {"n_prompt_tokens": 5000, "n_ctx": 4096}',
            4096,
            5000,
        ),
    ],
)
def test_context_refusals_of_common_servers_are_read(message: str, limit: int, prompt: int) -> None:
    found = context_refusal(message)
    assert found is not None and (found.limit, found.prompt_tokens) == (limit, prompt)


def test_other_refusals_are_not_context_refusals() -> None:
    assert context_refusal("invalid value for temperature") is None


# -- per-model options ---------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_top_p_extra_body_and_headers_reach_the_server(
    api: str, server: LLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_GATEWAY_TOKEN", "gw-secret-7b1c")
    route(server, api).push(Reply(fenced(vecadd())), Status(400, "rejected gw-secret-7b1c"))
    p = make(
        api,
        url_of(server, api),
        tmp_path,
        top_p=0.9,
        extra_body={"top_k": 20, "repetition_penalty": 1.05},
        headers={"X-Title": "kfoundry"},
        header_env={"X-Gateway-Token": "KF_GATEWAY_TOKEN"},
    )
    p.propose(request(n=2))
    req = server.calls(api)[0]
    assert (
        req["body"]["top_p"] == 0.9
        and req["body"]["top_k"] == 20
        and req["body"]["repetition_penalty"] == 1.05
    )
    assert req["headers"]["x-title"] == "kfoundry" and req["headers"]["x-gateway-token"] == "gw-secret-7b1c"
    errors = [c.error for c in load_recording(tmp_path / "calls.jsonl") if c.error]
    assert errors and all("gw-secret-7b1c" not in e for e in errors)


def test_options_are_checked_at_config_load() -> None:
    for options, where in [
        ({"top_p": 1.5}, "top_p"),
        ({"headers": {"Bad Header": "x"}}, "headers"),
        ({"headers": {"X-A": "line\nbreak"}}, "headers"),
        ({"extra_body": "nope"}, "extra_body"),
        ({"extra_body": {"max_tokens": 100000}}, "max_tokens: set by kfoundry"),
        ({"extra_body": {"n": 4, "top_k": 2}}, "n: set by kfoundry"),
        ({"extra_body": {"stream": True}}, "stream: set by kfoundry"),
        ({"tokenizer": "magic"}, "tokenizer"),
    ]:
        with pytest.raises(ConfigError, match=where):
            load_config(data={"llms": [{"name": "openai", "model": "m", "options": options}]})


def test_missing_header_variable_is_a_config_error(server: LLMServer, tmp_path: Path) -> None:
    p = make("openai", server.openai_url, tmp_path, header_env={"X-Token": "KF_NOT_SET_ANYWHERE"})
    with pytest.raises(ConfigError, match="KF_NOT_SET_ANYWHERE"):
        p.propose(request())


# -- error patterns ----------------------------------------------------------------------------------


def test_pocl_errors_with_random_temp_names_make_one_pattern() -> None:
    from kfoundry.core.llm.meta import ErrorPatterns

    patterns = ErrorPatterns(threshold=3)
    for name, pos in (("tempfile_TPRlVx", "5:46"), ("tempfile_Ab12Cd", "13:25"), ("tempfile_zzQ9k1", "7:3")):
        log = (
            "clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\nBuild on <pyopencl.Device 'pthread' at "
            f"0x55742f065f80>:\n\nerror: /root/.cache/pocl/kcache/{name}.cl:{pos}: use of undeclared "
            "identifier 'undeclared_x'\n1 error generated."
        )
        patterns.add(
            EvalRecord(
                candidate_hash="h",
                eval_key="k",
                problem="p",
                backend="opencl",
                device="d",
                outcome=Outcome.compile_error,
                message="build failed",
                log=log,
            )
        )
    [pitfall] = patterns.pitfalls()
    assert "Seen 3 times" in pitfall and "use of undeclared identifier 'undeclared_x'" in pitfall
    assert "tempfile" not in pitfall and "/root" not in pitfall


@pytest.mark.slow  # about 10 s on an idle machine (an evaluator, three PoCL compiles)
def test_on_pocl_three_identical_compile_errors_make_one_pitfall_that_reaches_the_next_prompt(
    server: LLMServer, tmp_path: Path
) -> None:
    from eval_helpers import EXAMPLES, fast_config

    from kfoundry.core.ensemble import build_ensemble
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem

    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 2048})
    broken = [  # three different kernels, one mistake: PoCL compiles each from its own temp file
        Candidate(source=vecadd(block).replace("+ b[i + k]", "+ undeclared_x"), language="opencl")
        for block in (32, 64, 128)
    ]
    with Evaluator(problem, fast_config(cache=False)) as evaluator:
        records = evaluator.evaluate_many(broken)
    assert [r.outcome for r in records] == [Outcome.compile_error] * 3
    temp_lines = [next(x for x in r.log.splitlines() if "undeclared_x" in x) for r in records]
    assert len(set(temp_lines)) == 3, temp_lines  # the raw lines differ (temp names) ...

    config = load_config(
        data={
            "llms": [
                {
                    "name": "openai",
                    "model": "m",
                    "options": {
                        "base_url": server.openai_url,
                        "api_key_env": "KF_TEST_KEY",
                        "max_retries": 0,
                    },
                }
            ],
            "ensemble": {"meta_every": 0},
        }
    )
    ensemble = build_ensemble(config, attach=False)
    for cand, rec in zip(broken, records, strict=True):
        ensemble.observe(cand, rec)
    assert ensemble.prompts is not None
    [pitfall] = ensemble.prompts.errors.pitfalls()  # ... but make one pattern
    assert "Seen 3 times" in pitfall and "use of undeclared identifier 'undeclared_x'" in pitfall
    server.openai.push(Reply(fenced(vecadd())))
    ensemble.propose(request())
    prompt = server.calls("openai")[0]["body"]["messages"][1]["content"]
    assert pitfall.lstrip("- ") in prompt


# -- whole runs through kf-run -------------------------------------------------------------------------

ROOT = Path(__file__).parents[1]


def kf_run(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
    )


def test_kf_run_with_a_base_url_typo_is_one_line_before_any_run_folder(tmp_path: Path) -> None:
    done = kf_run(
        str(ROOT / "examples/kernelbench/vector_add.py"),
        "--set", "llms.0.name=openai", "--set", "llms.0.model=m",
        "--set", "llms.0.options.base_url=http//127.0.0.1:8000/v1",
        "--set", f"output_dir={tmp_path / 'runs'}",
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "llms[0].options.base_url" in done.stderr and "must start with http://" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_kf_run_without_a_model_stops_in_one_line_marks_the_run_failed_and_resumes(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    cfg = {
        "output_dir": str(tmp_path / "runs"),
        "llms": [
            {
                "name": "openai",
                "model": "m",
                "options": {"base_url": url, "api_key_env": "", "max_retries": 1, "timeout": 20.0},
            }
        ],
        "ensemble": {"meta_every": 0},
        "tuner": {"every": -1},
        "budget": {"generations": 1, "proposals_per_generation": 2},
        "evaluation": {"trials": 2, "warmup_s": 0.0, "min_repeats": 3, "max_repeats": 5, "target_time_s": 0.01,
                       "rotate_bytes": 0, "timeout_s": 60, "correctness_budget_s": 0.0},
    }  # fmt: skip
    config = tmp_path / "run.toml"
    config.write_bytes(tomli_w.dumps(cfg).encode())
    problem = str(ROOT / "examples/kernelbench/vector_add.py")
    done = kf_run(problem, "--config", str(config), "--shape", "N=4096")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: llm openai:m: cannot reach the openai server at " + url), line
    assert "Connection refused" in line
    [run_dir] = list((tmp_path / "runs").iterdir())
    conn = sqlite3.connect(run_dir / "kfoundry.db")
    status, summary = conn.execute("SELECT status, summary FROM runs").fetchone()
    assert status == "failed" and "cannot reach" in json.loads(summary)["stop_reason"]
    assert conn.execute("SELECT COUNT(*) FROM loop_proposals").fetchone()[0] == 0
    conn.close()
    with LLMServer(port=port) as srv:  # the server is back: resume finishes the run
        srv.openai.push(Status(400, "refused by the test"))
        srv.openai.responder = lambda body: Reply(fenced(vecadd(64, 2)))
        again = kf_run("resume", str(run_dir))
        assert len(srv.calls("openai")) == 2  # generation 0 follows proposals_per_generation
    assert again.returncode == 0, again.stderr[-3000:]
    conn = sqlite3.connect(run_dir / "kfoundry.db")
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "finished"
    outcomes = [r[0] for r in conn.execute("SELECT json_extract(record, '$.outcome') FROM loop_proposals")]
    assert outcomes.count("correct") >= 1 and len(outcomes) >= 1
    kinds = [r[0] for r in conn.execute("SELECT error_kind FROM llm_calls ORDER BY seq")]
    assert kinds == ["unreachable", "refused", None]
    # the refused call was shown as it happened, and both failures are counted in the summary
    [shown] = [x for x in again.stderr.splitlines() if "call failed" in x]
    assert "llm openai:m: generate call failed (refused, 1 attempts): HTTP 400: refused by the test" in shown
    assert "LLM: 1 calls, 2 failed (1 refused, 1 unreachable)" in again.stdout


def test_a_call_that_stopped_the_run_is_asked_again_by_a_resumed_run_and_skipped_by_replay(
    tmp_path: Path,
) -> None:
    from kfoundry.core.store import Store
    from kfoundry.plugins.llms.replay import ReplayOptions, ReplayProvider

    port = free_port()
    store = Store(tmp_path / "kfoundry.db")
    p = make("openai", f"http://127.0.0.1:{port}/v1", tmp_path)
    p.configure(recorder=Recorder(store, tmp_path / "calls.jsonl", run_id="r1"))
    with pytest.raises(ModelUnreachable):
        p.propose(request())
    resumed = Recorder(store, tmp_path / "calls.jsonl", run_id="r1")  # what `kf-run resume` builds
    with LLMServer(key=KEY, port=port) as srv:
        srv.openai.push(Reply(fenced(vecadd(128))))
        p.configure(recorder=resumed)
        [live] = p.propose(request())
    calls = load_recording(tmp_path / "calls.jsonl")
    assert [(c.error_kind, c.occurrence) for c in calls] == [("unreachable", 0), (None, 0)]
    replay = ReplayProvider(ReplayOptions(recording=str(tmp_path / "calls.jsonl")))
    [again] = replay.propose(request())
    assert again.candidate is not None and live.candidate is not None
    assert again.candidate.source == live.candidate.source
    store.close()


@pytest.mark.parametrize("api", APIS)
def test_a_server_that_refuses_every_call_stops_the_run(api: str, server: LLMServer, tmp_path: Path) -> None:
    route(server, api).responder = lambda body: Status(400, "unknown field 'top_k'")
    p = make(api, url_of(server, api), tmp_path, max_failed_calls=3)
    with pytest.raises(
        ModelUnreachable, match=r"refused or failed the last 3 calls \(last error: HTTP 400: unknown"
    ):
        p.propose(request(n=5))
    assert len(server.calls(api)) == 3
    assert [c.error_kind for c in load_recording(tmp_path / "calls.jsonl")] == [
        "refused",
        "refused",
        "unreachable",
    ]


def test_an_ensemble_goes_on_while_one_member_answers_and_stops_when_none_does(
    server: LLMServer, tmp_path: Path
) -> None:
    from kfoundry.core.ensemble import build_ensemble

    dead = f"http://127.0.0.1:{free_port()}/v1"
    opts = {"api_key_env": "KF_TEST_KEY", "max_retries": 0, "timeout": 2.0}
    config = load_config(
        data={
            "llms": [
                {"name": "openai", "model": "dead", "options": {**opts, "base_url": dead}},
                {"name": "openai", "model": "live", "options": {**opts, "base_url": server.openai_url}},
            ],
            "ensemble": {"mode": "vote", "meta_every": 0},
        }
    )
    ensemble = build_ensemble(config, run_dir=tmp_path, attach=False)
    server.openai.responder = lambda body: Reply(fenced(vecadd()))
    props = ensemble.propose(request(n=2))
    assert [p.generator for p in props] == ["openai:live"]
    assert ensemble.unreachable == {"openai:dead"}
    server.kill()
    with pytest.raises(ModelUnreachable):
        ensemble.propose(request(n=2))
    assert ensemble.usage()["failures"] == {"unreachable": 3}  # dead twice, then the killed one
