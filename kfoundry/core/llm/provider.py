"""The base of every language-model provider: prompt, budget, retries, recording, parsing, ranking.

A subclass implements :meth:`LLMProvider._complete` (one HTTP call through its SDK, mapping the
SDK's failures to :class:`TransientError` or :class:`LLMError`). Everything else is shared, so
every provider counts tokens, honours the caps, retries and records the same way.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kfoundry.core.errors import ConfigError, KfError
from kfoundry.core.generator import GenerationRequest, Generator
from kfoundry.core.llm.cost import (
    CONSERVATIVE_BYTES_PER_TOKEN,
    CostLedger,
    LLMBudgetExhausted,
    Price,
    Reservation,
    TokenCounter,
    TokenizerMode,
    chat_tokens,
    estimate_tokens,
)
from kfoundry.core.llm.parsing import ParseFailure, parse_reply
from kfoundry.core.llm.prompts import Prompt, PromptBuilder
from kfoundry.core.llm.recording import CallKind, CallRecord, ErrorKind, Recorder, request_key
from kfoundry.core.llm.retry import RetriesExhausted, RetryPolicy, TransientError
from kfoundry.core.models import Candidate, Proposal, stable_hash

log = logging.getLogger(__name__)


class LLMError(KfError):
    """A provider failure that retrying cannot fix (bad key, unknown model, refused request)."""


class ModelUnreachable(LLMError):
    """No answer from the model's server: nothing listens there, or every recent call failed.

    The message names the member, the provider, the URL and the last error; the loop marks the run
    failed (``kf-run resume`` continues it once the server answers).
    """


class CallRefused(Exception):
    """The server refused this one request (400, 413, 422): not retried, not fatal to the run."""


#: Which server messages mean "prompt plus completion limit exceed the context window", and where
#: the numbers are: OpenAI and vLLM ("maximum context length is 8192 tokens ... (7000 in the
#: messages"), vLLM's newer wording ("your request has 7000 input tokens"), Anthropic ("input length
#: and `max_tokens` exceed context limit: 7000 + 8192 > 8192", "prompt is too long: 9000 tokens >
#: 8192 maximum"), llama.cpp ("exceeds the available context size", "n_ctx": 8192) and others.
_CONTEXT_HINTS = re.compile(
    r"context[ _-]?(length|window|size|limit)|maximum context|prompt is too long|too many tokens"
    r"|exceed_context_size|n_ctx|reduce the length",
    re.IGNORECASE,
)
_LIMIT = [
    re.compile(r"maximum context length is (\d+)", re.IGNORECASE),
    re.compile(r"context limit: *\d+ *\+ *\d+ *> *(\d+)", re.IGNORECASE),
    re.compile(r"tokens *> *(\d+) *maximum", re.IGNORECASE),
    re.compile(r"n_ctx\W+(\d+)", re.IGNORECASE),
    re.compile(r"context (?:length|window|size)(?: of| is|:)? *(\d+)", re.IGNORECASE),
]
_PROMPT = [
    re.compile(r"\((\d+) in the messages", re.IGNORECASE),
    re.compile(r"request has (\d+) input tokens", re.IGNORECASE),
    re.compile(r"context limit: *(\d+) *\+", re.IGNORECASE),
    re.compile(r"prompt is too long: *(\d+) tokens", re.IGNORECASE),
    re.compile(r"n_prompt_tokens\W+(\d+)", re.IGNORECASE),
]


@dataclass
class ContextRefusal:
    """What a context-length refusal said: the window and (if given) the prompt's tokens."""

    limit: int | None
    prompt_tokens: int | None


def context_refusal(message: str) -> ContextRefusal | None:
    """The numbers of a context-length refusal, or None if ``message`` is another kind of refusal."""
    text = message[:2000]
    if not _CONTEXT_HINTS.search(text):
        return None

    def first(patterns: list[re.Pattern[str]]) -> int | None:
        for pat in patterns:
            m = pat.search(text)
            if m:
                return int(m.group(1))
        return None

    return ContextRefusal(first(_LIMIT), first(_PROMPT))


def check_base_url(url: str) -> str:
    """``url`` if it can be an API base URL (http or https, a host, a valid port); else ValueError."""
    if not url or url != url.strip() or any(c.isspace() for c in url):
        raise ValueError(f"base_url {url!r} must not be empty or contain spaces")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # bad port, bad IPv6 literal
        raise ValueError(f"base_url {url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        hint = f" (did you mean http://{url.split('://', 1)[-1].lstrip('/')}?)"
        raise ValueError(f"base_url {url!r} must start with http:// or https://{hint}")
    if not parts.hostname:
        rest = url.split(":", 1)[1].lstrip("/")
        raise ValueError(f"base_url {url!r} has no host (did you mean {parts.scheme}://{rest}?)")
    if port == 0:
        raise ValueError(f"base_url {url!r}: port 0 is not a server port")
    if parts.query or parts.fragment:
        raise ValueError(f"base_url {url!r} must not have a query or fragment")
    return url


#: Request fields kfoundry sets itself: ``extra_body`` may not override them (a larger completion
#: limit, several choices or a stream would break the caps or the reading of the reply).
_RESERVED_BODY = frozenset(
    {"model", "messages", "system", "max_tokens", "max_completion_tokens", "n", "stream", "stream_options"}
)


def _check_headers(headers: dict[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
            raise ValueError(f"header name {name!r} is not a valid HTTP header name")
        if any(c in value for c in "\r\n\0"):
            raise ValueError(f"header {name}: value must be one line")
    return headers


class ProviderOptions(BaseModel):
    """Options every HTTP provider shares."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(
        default=None, description="API base URL (an OpenAI-compatible server's ends in /v1)."
    )
    api_key_env: str | None = Field(
        default=None,
        description="Environment variable holding the API key (None: the provider's default; '': no key).",
    )
    temperature: float | None = Field(
        default=0.7, ge=0, le=2, description="Sampling temperature (None: server default)."
    )
    max_tokens: int = Field(default=8192, ge=16, description="Completion token limit per call.")
    timeout: float = Field(default=300.0, gt=0, description="Seconds before one HTTP attempt times out.")
    max_retries: int = Field(
        default=4, ge=0, description="Retries on 429, 5xx, timeouts and malformed replies."
    )
    price: Price = Field(default_factory=Price, description="USD per million tokens (input, output).")
    templates: str | None = Field(
        default=None, description="Directory of Jinja2 templates overriding the bundled ones."
    )
    top_p: float | None = Field(default=None, gt=0, le=1, description="Nucleus sampling (None: not sent).")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra JSON fields merged into every request body (e.g. vLLM's top_k or "
        "repetition_penalty, Ollama's options).",
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra HTTP headers sent with every request (not for secrets)."
    )
    header_env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra HTTP headers whose values come from environment variables (header name -> "
        "variable); the values are masked like the key.",
    )
    tokenizer: TokenizerMode = Field(
        default="cached",
        description="Local token counts for OpenAI-family models: cached (tiktoken, only if its encoding "
        "is on this machine), download (tiktoken may fetch it), off (conservative estimate only).",
    )
    concurrency: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Calls to this provider in flight at once (a generation's requests go out together).",
    )
    max_failed_calls: int = Field(
        default=3,
        ge=1,
        description="Calls in a row without an answer (retries spent, or refused) after which the model "
        "counts as unreachable and the run stops (a server that refuses connections stops it at once).",
    )

    @field_validator("base_url")
    @classmethod
    def _valid_base_url(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value)

    @field_validator("headers", "header_env")
    @classmethod
    def _valid_headers(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_headers(value)

    @field_validator("extra_body")
    @classmethod
    def _no_reserved_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(value) & _RESERVED_BODY)
        if taken:  # the caps, the parsing and the recording rely on these
            raise ValueError(f"{', '.join(taken)}: set by kfoundry (use the provider's own options)")
        return value


@dataclass
class Completion:
    """What one successful call returned."""

    text: str
    tokens_in: int
    tokens_out: int
    finish_reason: str = ""
    cost_usd: float | None = None
    #: False when the server sent no usage block (the tokens are then counted locally).
    usage: bool = True


_RANKING = re.compile(r"RANKING\s*:\s*([0-9][0-9\s>,;]*)", re.IGNORECASE)


def _plain(text: str) -> str:
    """An error message without its leading ``llm NAME:`` (the log line names the member already)."""
    return re.sub(r"^llm \S+: ", "", text)


def parse_ranking(text: str, n: int) -> list[int] | None:
    """0-based order from a ``RANKING: 2 > 1 > 3`` line (missing ones appended in order); None if absent."""
    matches = _RANKING.findall(text or "")
    if not matches:
        return None
    order: list[int] = []
    for tok in re.findall(r"\d+", matches[-1]):
        i = int(tok) - 1
        if 0 <= i < n and i not in order:
            order.append(i)
    if not order:
        return None
    return order + [i for i in range(n) if i not in order]


class LLMProvider(Generator):
    """A generator backed by a chat model; subclasses implement :meth:`_complete`."""

    provider: ClassVar[str] = "llm"
    default_model: ClassVar[str] = ""
    default_key_env: ClassVar[str | None] = None
    #: Where the SDK sends requests when ``base_url`` is not set.
    default_base_url: ClassVar[str] = ""

    def __init__(self, options: ProviderOptions) -> None:
        self.options = options
        self.name = self.provider
        self.model = self.default_model
        self.ledger = CostLedger()
        self.recorder: Recorder | None = None
        self.builder = PromptBuilder(options.templates)
        self.retry = RetryPolicy(max_retries=options.max_retries)
        self._feedback: str = ""
        #: Set once the caps refused one of this provider's calls.
        self.budget_refused = False
        #: The model's context window, once a context-length refusal told it.
        self.context_window: int | None = None
        self._counter: TokenCounter | None = None
        self._failed_in_row = 0
        self._context_refused = False
        #: At most ``options.concurrency`` calls in flight; a call waits for a slot before it reserves.
        self._slots = threading.BoundedSemaphore(options.concurrency)

    @property
    def concurrency(self) -> int:
        """Calls this provider takes at once."""
        return self.options.concurrency

    # -- configuration -----------------------------------------------------------------------------

    def configure(
        self,
        *,
        model: str | None = None,
        name: str | None = None,
        ledger: CostLedger | None = None,
        recorder: Recorder | None = None,
    ) -> LLMProvider:
        """Set the model, member name, shared ledger and recorder (the ensemble calls this)."""
        if model:
            self.model = model
            self._counter = None
        if name:
            self.name = name
        if ledger is not None:
            self.ledger = ledger
        if recorder is not None:
            self.recorder = recorder
        return self

    @property
    def price(self) -> Price:
        return self.options.price

    @property
    def tokens(self) -> TokenCounter:
        """The local token counter for this model (tiktoken for OpenAI-family models, else an estimate)."""
        if self._counter is None:
            self._counter = (
                TokenCounter.for_model(self.model, self.options.tokenizer)
                if self.provider == "openai"
                else TokenCounter()
            )
        return self._counter

    def endpoint(self) -> str:
        """The base URL requests go to."""
        return self.options.base_url or self.default_base_url or "(the SDK's default URL)"

    def api_key(self) -> str:
        """The key from the environment variable the options name (never logged or stored)."""
        var = self.default_key_env if self.options.api_key_env is None else self.options.api_key_env
        if not var:  # "" : a local server that wants no key
            return "not-needed"
        value = os.environ.get(var)
        if not value:
            raise ConfigError(
                f"llm {self.name}: environment variable {var} is not set (it must hold the API key)"
            )
        return value

    def extra_headers(self) -> dict[str, str]:
        """``headers`` plus the ``header_env`` headers read from the environment (a missing one is an error)."""
        out = dict(self.options.headers)
        for header, var in self.options.header_env.items():
            value = os.environ.get(var)
            if not value:
                raise ConfigError(f"llm {self.name}: environment variable {var} (header {header}) is not set")
            out[header] = value
        return out

    def scrub(self, text: str) -> str:
        """``text`` with the API key and secret headers (if set) masked; every error passes through here."""
        var = self.options.api_key_env or self.default_key_env
        names = [var] if var else []
        names += list(self.options.header_env.values())
        for name in names:
            secret = os.environ.get(name, "")
            if len(secret) >= 4:
                text = text.replace(secret, "***")
        return text

    # -- the one call ------------------------------------------------------------------------------

    def _complete(self, prompt: Prompt, max_tokens: int) -> Completion:
        """One attempt; raise :class:`TransientError` to retry, :class:`LLMError` to stop."""
        raise NotImplementedError

    def _fetch(
        self, kind: CallKind, key: str, occurrence: int, prompt: Prompt, max_tokens: int
    ) -> tuple[Completion, int]:
        """The completion for a call and the number of attempts (replay overrides this)."""
        attempts = 0

        def attempt() -> Completion:
            nonlocal attempts
            attempts += 1
            return self._complete(prompt, max_tokens)

        return self.retry.call(attempt), attempts

    def prompt_estimate(self, prompt: Prompt) -> int:
        """Tokens to reserve for ``prompt``: the exact local count (+5%), else the ledger's estimate."""
        parts = [prompt.system, prompt.user]
        if self.tokens.exact:
            return int(self.tokens.prompt(parts) * 1.05) + 1
        return chat_tokens(parts, lambda t: estimate_tokens(t, self.ledger.chars_per_token))

    def call(
        self,
        kind: CallKind,
        prompt: Prompt,
        key: str,
        max_tokens: int | None = None,
        generation: int | None = None,
    ) -> Completion | None:
        """Make one budgeted, retried, recorded call; the completion, or None if this call failed.

        Raises :class:`LLMBudgetExhausted` (before any request) when the caps leave no room,
        :class:`ModelUnreachable` when the server cannot be reached, and :class:`LLMError` on
        another permanent failure. Every failed call is logged (one warning line) and counted.
        """
        with self._slots:  # the per-provider concurrency limit; the ledger's reservation keeps caps exact
            return self._call(kind, prompt, key, max_tokens, generation)

    def _call(
        self,
        kind: CallKind,
        prompt: Prompt,
        key: str,
        max_tokens: int | None = None,
        generation: int | None = None,
    ) -> Completion | None:
        self._context_refused = False
        estimate = self.prompt_estimate(prompt)
        limit = min(max_tokens or self.options.max_tokens, self.options.max_tokens)
        if self.context_window is not None:  # learned from an earlier refusal: ask only for what fits
            limit = max(16, min(limit, self.context_window - estimate))
        base = CallRecord(
            member=self.name,
            provider=self.provider,
            model=self.model,
            kind=kind,
            request_key=key,
            prompt_hash=stable_hash(prompt.system, prompt.user),
            system=prompt.system,
            prompt=prompt.user,
            generation=generation,
            price_in=self.price.input_per_mtok,
            price_out=self.price.output_per_mtok,
        )
        try:
            reservation = self.ledger.reserve(estimate, limit, self.price)
        except LLMBudgetExhausted as exc:  # recorded (nothing sent) so the store shows where the cap cut
            self._record(
                base.model_copy(
                    update={"attempts": 0, "error": str(exc), "error_kind": "budget", "max_tokens": estimate}
                )
            )
            raise
        occurrence = self.recorder.occurrence(self.name, key) if self.recorder else 0
        record = base.model_copy(update={"occurrence": occurrence, "max_tokens": reservation.max_tokens})
        start = time.perf_counter()
        try:
            try:
                completion, attempts = self._fetch(kind, key, occurrence, prompt, reservation.max_tokens)
            except CallRefused as exc:
                retry = self._fits_after_refusal(str(exc), estimate, reservation.max_tokens)
                if retry is None:
                    raise
                log.warning("llm %s: %s; asking again with max_tokens=%d", self.name, _plain(str(exc)), retry)
                reservation.max_tokens = retry
                record = record.model_copy(update={"max_tokens": retry})
                completion, attempts = self._fetch(kind, key, occurrence, prompt, retry)
                attempts += 1
        except (RetriesExhausted, LLMError, CallRefused) as exc:
            self.ledger.release(reservation)
            self._failed(kind, key, record, exc, time.perf_counter() - start)
            return None  # _failed raised for what stops the run
        self._failed_in_row = 0
        tokens_in, tokens_out = self._charged(prompt, completion, reservation)
        completion.text = self.scrub(completion.text)
        cost = (
            completion.cost_usd if completion.cost_usd is not None else self.price.cost(tokens_in, tokens_out)
        )
        self.ledger.settle(reservation, self.name, tokens_in, tokens_out, cost)
        self._record(
            record.model_copy(
                update={
                    "response": completion.text,
                    "tokens_in": tokens_in,
                    "tokens_out": tokens_out,
                    "cost_usd": cost,
                    "attempts": attempts,
                    "latency_s": time.perf_counter() - start,
                }
            )
        )
        completion.tokens_in, completion.tokens_out, completion.cost_usd = tokens_in, tokens_out, cost
        return completion

    def _charged(self, prompt: Prompt, completion: Completion, reservation: Reservation) -> tuple[int, int]:
        """Tokens to charge: the server's usage and the local count, the larger of the two; without a
        (plausible) usage block, the local count (completion tokens at most the limit sent)."""
        parts = [prompt.system, prompt.user]
        nbytes = sum(len(p.encode("utf-8", "replace")) for p in parts)
        density = min(self.ledger.chars_per_token, CONSERVATIVE_BYTES_PER_TOKEN)
        local_in = self.tokens.prompt(parts, density)
        local_out = min(self.tokens.count(completion.text, density), reservation.max_tokens)
        if completion.finish_reason in ("length", "max_tokens"):
            local_out = reservation.max_tokens
        plausible = completion.usage and completion.tokens_in * 16 >= nbytes
        if not plausible:
            log.debug(
                "llm %s: no usable usage block; counted locally (%d in, %d out)",
                self.name,
                local_in,
                local_out,
            )
            return local_in, (max(local_out, completion.tokens_out) if completion.usage else local_out)
        self.ledger.observe_prompt(nbytes, completion.tokens_in)
        if self.tokens.exact:
            return max(completion.tokens_in, local_in), max(completion.tokens_out, local_out)
        return completion.tokens_in, completion.tokens_out

    def _fits_after_refusal(self, message: str, estimate: int, sent: int) -> int | None:
        """The smaller completion limit to ask again with after a context-length refusal, or None."""
        found = context_refusal(message)
        if found is None:
            return None
        self._context_refused = True
        if found.limit is None:
            return None
        self.context_window = found.limit
        need = found.prompt_tokens if found.prompt_tokens is not None else estimate
        room = found.limit - need - 16
        return room if 256 <= room < sent else None

    def _failed(self, kind: CallKind, key: str, record: CallRecord, exc: Exception, latency: float) -> None:
        """Record, count and log one failed call; raise what stops the run."""
        text = self.scrub(str(exc))
        shown = _plain(text)
        error_kind: ErrorKind
        stop: LLMError | None = None
        if isinstance(exc, LLMError):
            error_kind, stop = "fatal", LLMError(text)
        else:
            self._failed_in_row += 1
            n = self._failed_in_row
            if isinstance(exc, CallRefused):
                error_kind = "context" if self._context_refused else "refused"
                if n >= self.options.max_failed_calls:
                    stop = ModelUnreachable(
                        f"llm {self.name}: the {self.provider} server at {self.endpoint()} refused or failed "
                        f"the last {n} calls (last error: {shown})"
                    )
            else:
                assert isinstance(exc, RetriesExhausted)
                last = shown = _plain(self.scrub(exc.attempts[-1])) if exc.attempts else shown
                error_kind = "timeout" if exc.timed_out else "transient"
                if exc.unreachable:
                    stop = ModelUnreachable(
                        f"llm {self.name}: cannot reach the {self.provider} server at {self.endpoint()} "
                        f"({len(exc.attempts)} attempts; last error: {last})"
                    )
                elif n >= self.options.max_failed_calls:
                    stop = ModelUnreachable(
                        f"llm {self.name}: the {self.provider} server at {self.endpoint()} answered none of "
                        f"the last {n} calls (last error: {last})"
                    )
            if stop is not None:
                error_kind = "unreachable"
                if self.recorder is not None:  # a resumed run asks this again as if it never happened
                    self.recorder.forget(self.name, key)
        attempts = len(exc.attempts) if isinstance(exc, RetriesExhausted) else 1
        self._record(
            record.model_copy(
                update={"error": text, "error_kind": error_kind, "attempts": attempts, "latency_s": latency}
            )
        )
        self.ledger.fail(self.name, error_kind)
        if stop is None:
            what = {"context": "too long for the model's context", "timeout": "timed out"}.get(
                error_kind, error_kind
            )
            log.warning(
                "llm %s: %s call failed (%s, %d attempts): %s", self.name, kind, what, attempts, shown
            )
            return
        raise stop from None

    def _record(self, record: CallRecord) -> None:
        if self.recorder is not None:
            self.recorder.record(record)

    # -- Generator ---------------------------------------------------------------------------------

    def propose(self, request: GenerationRequest) -> list[Proposal]:
        """``request.n`` calls, each parsed into a proposal (a parse failure is a proposal too)."""
        proposals: list[Proposal] = []
        for _ in range(request.n):
            req = request
            if self._feedback:
                req = request.model_copy(
                    update={"extra": {**request.extra, "reply_feedback": self._feedback}}
                )
            prompt = self.builder.generation(req)
            key = request_key(self.name, "generate", req)
            try:
                done = self.call("generate", prompt, key, generation=request.generation)
                if done is None and self._context_refused and req.inspirations:
                    req = req.model_copy(update={"inspirations": []})  # a shorter prompt: no inspirations
                    log.warning(
                        "llm %s: asking again without the %d inspirations",
                        self.name,
                        len(request.inspirations),
                    )
                    key = request_key(self.name, "generate", req)
                    done = self.call(
                        "generate", self.builder.generation(req), key, generation=request.generation
                    )
            except LLMBudgetExhausted:
                self.budget_refused = True
                if not proposals:
                    raise
                return proposals  # keep what was already paid for
            if done is not None:
                proposals.append(
                    self._proposal(req, done.text, done.tokens_in, done.tokens_out, done.cost_usd or 0.0)
                )
        return proposals

    def _proposal(
        self, request: GenerationRequest, text: str, tokens_in: int, tokens_out: int, cost: float
    ) -> Proposal:
        parent = request.parent.candidate if request.parent else None
        common: dict[str, Any] = {
            "generator": self.name,
            "prompt_id": request.prompt_id,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": cost,
        }
        try:
            parsed = parse_reply(text, request.problem.format, parent.source if parent else None)
        except ParseFailure as exc:
            self._feedback = str(exc)
            return Proposal(parse_error=str(exc), **common)
        self._feedback = ""
        params = parsed.params or (dict(parent.params) if parent and parsed.via == "diff" else {})
        space = parsed.space or (parent.space if parent and parsed.via == "diff" else None)
        candidate = Candidate(
            source=parsed.source,
            language=request.language,
            kind=request.problem.format,
            params=params,
            space=space,
            parent_id=parent.content_hash if parent else None,
            generator=self.name,
            prompt_id=request.prompt_id,
            label=f"{self.name} g{request.generation} {request.mode}",
            meta={"via": parsed.via, "model": self.model},
        )
        return Proposal(candidate=candidate, rationale=parsed.rationale, **common)

    def rank(self, request: GenerationRequest, proposals: list[Proposal]) -> list[float] | None:
        """Ask the model to rank the proposals against the rubric; scores are Borda points (or None)."""
        if len(proposals) < 2:
            return None
        prompt = self.builder.ranking(request, proposals)
        key = request_key(self.name, "rank", request, proposals)
        done = self.call("rank", prompt, key, max_tokens=1024, generation=request.generation)
        order = parse_ranking(done.text if done else "", len(proposals))
        if order is None:
            return None
        scores = [0.0] * len(proposals)
        for pos, idx in enumerate(order):
            scores[idx] = float(len(proposals) - 1 - pos)
        return scores

    def complete_text(
        self, prompt: Prompt, key: str, kind: CallKind = "meta", generation: int | None = None
    ) -> str | None:
        """A budgeted, recorded call for other uses (meta-prompting); the reply text or None."""
        done = self.call(kind, prompt, key, generation=generation)
        return done.text if done else None


__all__ = [
    "LLMProvider",
    "ProviderOptions",
    "Completion",
    "LLMError",
    "ModelUnreachable",
    "CallRefused",
    "LLMBudgetExhausted",
    "TransientError",
    "parse_ranking",
]
