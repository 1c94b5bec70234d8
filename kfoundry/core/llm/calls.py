"""One budgeted, retried, recorded call to a chat model: what every language-model provider does
before any of it is a kernel proposal.

:class:`ModelCaller` holds a provider's options, its member name and model, the shared cost ledger,
the recorder and the retry policy; :meth:`ModelCaller.call` reserves tokens under the caps, calls
:meth:`ModelCaller._complete` (one HTTP attempt, the subclass's) through the retry policy, asks again
with a smaller completion limit after a context-length refusal, charges what was used, records the
call and counts failures until the model counts as unreachable. Its log lines keep the logger name
``kfoundry.core.llm.provider`` (where they were first written), so logging filters keep working.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from kfoundry.core.errors import ConfigError
from kfoundry.core.llm.cost import (
    CONSERVATIVE_BYTES_PER_TOKEN,
    CostLedger,
    LLMBudgetExhausted,
    Price,
    Reservation,
    TokenCounter,
    chat_tokens,
    estimate_tokens,
)
from kfoundry.core.llm.errors import CallRefused, LLMError, ModelUnreachable
from kfoundry.core.llm.http import context_refusal
from kfoundry.core.llm.prompts import Prompt
from kfoundry.core.llm.provider_options import ProviderOptions
from kfoundry.core.llm.recording import CallKind, CallRecord, ErrorKind, Recorder
from kfoundry.core.llm.retry import RetriesExhausted, RetryPolicy
from kfoundry.core.models import stable_hash

__all__ = ["Completion", "ModelCaller"]

log = logging.getLogger("kfoundry.core.llm.provider")

_Self = TypeVar("_Self", bound="ModelCaller")


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


def _plain(text: str) -> str:
    """An error message without its leading ``llm NAME:`` (the log line names the member already)."""
    return re.sub(r"^llm \S+: ", "", text)


class ModelCaller:
    """Calls to one chat model under the run's caps; subclasses implement :meth:`_complete`."""

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
        self.retry = RetryPolicy(max_retries=options.max_retries)
        #: The model's context window, once a context-length refusal told it.
        self.context_window: int | None = None
        self._counter: TokenCounter | None = None
        self._failed_in_row = 0
        #: Whether the last call was refused for its length (the generator then shortens its prompt).
        self._context_refused = False
        #: At most ``options.concurrency`` calls in flight; a call waits for a slot before it reserves.
        self._slots = threading.BoundedSemaphore(options.concurrency)

    @property
    def concurrency(self) -> int:
        """Calls this provider takes at once."""
        return self.options.concurrency

    # -- configuration -----------------------------------------------------------------------------

    def configure(
        self: _Self,
        *,
        model: str | None = None,
        name: str | None = None,
        ledger: CostLedger | None = None,
        recorder: Recorder | None = None,
    ) -> _Self:
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
