"""The base of every language-model provider: prompt, budget, retries, recording, parsing, ranking.

A subclass implements :meth:`LLMProvider._complete` (one HTTP call through its SDK, mapping the
SDK's failures to :class:`TransientError` or :class:`LLMError`). Everything else is shared, so
every provider counts tokens, honours the caps, retries and records the same way.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from kfoundry.core.errors import ConfigError, KfError
from kfoundry.core.generator import GenerationRequest, Generator
from kfoundry.core.llm.cost import CostLedger, LLMBudgetExhausted, Price, estimate_tokens
from kfoundry.core.llm.parsing import ParseFailure, parse_reply
from kfoundry.core.llm.prompts import Prompt, PromptBuilder
from kfoundry.core.llm.recording import CallKind, CallRecord, Recorder, request_key
from kfoundry.core.llm.retry import RetriesExhausted, RetryPolicy, TransientError
from kfoundry.core.models import Candidate, Proposal, stable_hash


class LLMError(KfError):
    """A provider failure that retrying cannot fix (bad key, unknown model, refused request)."""


class CallRefused(Exception):
    """The server refused this one request (400, 413, 422): not retried, not fatal to the run."""


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


@dataclass
class Completion:
    """What one successful call returned."""

    text: str
    tokens_in: int
    tokens_out: int
    finish_reason: str = ""
    cost_usd: float | None = None


_RANKING = re.compile(r"RANKING\s*:\s*([0-9][0-9\s>,;]*)", re.IGNORECASE)


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

    def scrub(self, text: str) -> str:
        """``text`` with the API key (if set) masked; every error message passes through here."""
        var = self.options.api_key_env or self.default_key_env
        key = os.environ.get(var, "") if var else ""
        return text.replace(key, "***") if len(key) >= 4 else text

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

    def call(
        self,
        kind: CallKind,
        prompt: Prompt,
        key: str,
        max_tokens: int | None = None,
        generation: int | None = None,
    ) -> Completion | None:
        """Make one budgeted, retried, recorded call; the completion, or None if it failed transiently.

        Raises :class:`LLMBudgetExhausted` (before any request) when the caps leave no room, and
        :class:`LLMError` on a permanent failure.
        """
        limit = min(max_tokens or self.options.max_tokens, self.options.max_tokens)
        estimate = estimate_tokens(prompt.text, self.ledger.chars_per_token)
        try:
            reservation = self.ledger.reserve(estimate, limit, self.price)
        except LLMBudgetExhausted as exc:  # recorded (nothing sent) so the store shows where the cap cut
            self._record(
                CallRecord(
                    member=self.name,
                    provider=self.provider,
                    model=self.model,
                    kind=kind,
                    request_key=key,
                    prompt_hash=stable_hash(prompt.system, prompt.user),
                    system=prompt.system,
                    prompt=prompt.user,
                    generation=generation,
                    attempts=0,
                    error=str(exc),
                    error_kind="budget",
                    max_tokens=estimate,
                    price_in=self.price.input_per_mtok,
                    price_out=self.price.output_per_mtok,
                )
            )
            raise
        occurrence = self.recorder.occurrence(self.name, key) if self.recorder else 0
        start = time.perf_counter()
        record = CallRecord(
            member=self.name,
            provider=self.provider,
            model=self.model,
            kind=kind,
            request_key=key,
            occurrence=occurrence,
            prompt_hash=stable_hash(prompt.system, prompt.user),
            system=prompt.system,
            prompt=prompt.user,
            generation=generation,
            max_tokens=reservation.max_tokens,
            price_in=self.price.input_per_mtok,
            price_out=self.price.output_per_mtok,
        )
        try:
            completion, attempts = self._fetch(kind, key, occurrence, prompt, reservation.max_tokens)
        except (RetriesExhausted, LLMError, CallRefused) as exc:
            self.ledger.release(reservation)
            n = len(exc.attempts) if isinstance(exc, RetriesExhausted) else 1
            kind_of = (
                "fatal"
                if isinstance(exc, LLMError)
                else ("refused" if isinstance(exc, CallRefused) else "transient")
            )
            self._record(
                record.model_copy(
                    update={
                        "error": self.scrub(str(exc)),
                        "error_kind": kind_of,
                        "attempts": n,
                        "latency_s": time.perf_counter() - start,
                    }
                )
            )
            if isinstance(exc, LLMError):
                raise LLMError(self.scrub(str(exc))) from None
            return None
        completion.text = self.scrub(completion.text)
        cost = (
            completion.cost_usd
            if completion.cost_usd is not None
            else self.price.cost(completion.tokens_in, completion.tokens_out)
        )
        self.ledger.settle(reservation, self.name, completion.tokens_in, completion.tokens_out, cost)
        self.ledger.observe_prompt(len(prompt.text), completion.tokens_in)
        self._record(
            record.model_copy(
                update={
                    "response": completion.text,
                    "tokens_in": completion.tokens_in,
                    "tokens_out": completion.tokens_out,
                    "cost_usd": cost,
                    "attempts": attempts,
                    "latency_s": time.perf_counter() - start,
                }
            )
        )
        completion.cost_usd = cost
        return completion

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
    "LLMBudgetExhausted",
    "TransientError",
    "parse_ranking",
]
