"""Token and money accounting for language-model calls, with hard caps checked before every call.

One :class:`CostLedger` is shared by every member of an ensemble (and the meta-prompter), so the
caps in ``budget.llm_tokens`` / ``budget.llm_cost_usd`` hold for the whole run. Before a call the
ledger *reserves* the worst case (estimated prompt tokens plus the completion limit); a call whose
worst case does not fit is refused, so the totals never exceed a cap.

Prompt tokens are counted locally as well as read from the server's ``usage``: with ``tiktoken``
for OpenAI-family models (when its encoding is on this machine), otherwise by a conservative
estimate of :data:`CONSERVATIVE_BYTES_PER_TOKEN` UTF-8 bytes per token plus the chat template's
overhead, so the caps hold before the first reply and with servers that report no usage.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kfoundry.core.errors import KfError


class LLMBudgetExhausted(KfError):
    """The token or money cap of the run leaves no room for another language-model call."""


class Price(BaseModel):
    """US dollars per million tokens."""

    model_config = ConfigDict(extra="forbid")

    input_per_mtok: float = Field(default=0.0, ge=0, description="USD per million prompt tokens.")
    output_per_mtok: float = Field(default=0.0, ge=0, description="USD per million completion tokens.")

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input_per_mtok + tokens_out * self.output_per_mtok) / 1e6


#: UTF-8 bytes per token assumed until a served prompt shows the real density: about half of what
#: common tokenizers (GPT-2, cl100k, o200k, Llama, Mistral, Qwen) average on code and English.
CONSERVATIVE_BYTES_PER_TOKEN = 2.0
#: The least dense a learned estimate may become (a server reporting very few tokens is not believed).
MAX_LEARNED_BYTES_PER_TOKEN = 4.0
#: Tokens a chat template adds per message (role markers, separators) and to open the reply.
MESSAGE_OVERHEAD = 8
REPLY_OVERHEAD = 3


def estimate_tokens(text: str, chars_per_token: float = CONSERVATIVE_BYTES_PER_TOKEN) -> int:
    """A conservative token estimate: UTF-8 bytes over ``chars_per_token`` (at least 1)."""
    return max(1, math.ceil(len(text.encode("utf-8", "replace")) / chars_per_token))


def chat_tokens(parts: list[str], count: Callable[[str], int]) -> int:
    """Tokens of a chat prompt whose messages are ``parts``, counted by ``count``, with template overhead."""
    return sum(count(p) + MESSAGE_OVERHEAD for p in parts) + REPLY_OVERHEAD


# -- local tokenizers ------------------------------------------------------------------------------

#: ``cached``: use tiktoken only when its encoding file is already on this machine (never download);
#: ``download``: let tiktoken fetch a missing encoding once; ``off``: estimate only.
TokenizerMode = Literal["cached", "download", "off"]
_TIKTOKEN_LOCK = threading.Lock()


@contextlib.contextmanager
def _no_downloads() -> Iterator[None]:
    """tiktoken reads only local files (its cache) inside this block: a URL read fails at once."""
    import tiktoken.load as tl

    original = tl.read_file

    def local_only(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise OSError(f"not on this machine: {blobpath}")
        return original(blobpath)

    tl.read_file = local_only
    try:
        yield
    finally:
        tl.read_file = original


@functools.lru_cache(maxsize=16)
def tiktoken_encoding(model: str, mode: TokenizerMode = "cached") -> Any | None:
    """tiktoken's encoding for an OpenAI-family ``model`` (``gpt-5-mini``, ``openai/gpt-4o``, ``o3``),
    or None: not an OpenAI model, tiktoken not installed, or its encoding not available in ``mode``."""
    if mode == "off" or not model:
        return None
    try:
        import tiktoken
        from tiktoken.model import encoding_name_for_model
    except ImportError:
        return None
    try:
        name = encoding_name_for_model(model.rsplit("/", 1)[-1])
    except KeyError:
        return None
    with _TIKTOKEN_LOCK:
        try:
            if mode == "download":
                return tiktoken.get_encoding(name)
            with _no_downloads():
                return tiktoken.get_encoding(name)
        except Exception:  # noqa: BLE001 - a missing or corrupt encoding means: estimate instead
            return None


@dataclass
class TokenCounter:
    """Counts a model's tokens locally: exactly with a tiktoken ``encoding``, else by estimate."""

    encoding: Any | None = None

    @property
    def exact(self) -> bool:
        return self.encoding is not None

    def count(self, text: str, chars_per_token: float = CONSERVATIVE_BYTES_PER_TOKEN) -> int:
        if self.encoding is not None:
            return len(self.encoding.encode(text, disallowed_special=()))
        return estimate_tokens(text, chars_per_token)

    def prompt(self, parts: list[str], chars_per_token: float = CONSERVATIVE_BYTES_PER_TOKEN) -> int:
        """Tokens of a chat prompt made of ``parts`` (system, user)."""
        return chat_tokens(parts, lambda t: self.count(t, chars_per_token))

    @classmethod
    def for_model(cls, model: str, mode: TokenizerMode = "cached") -> TokenCounter:
        return cls(tiktoken_encoding(model, mode))


@dataclass
class Usage:
    """Totals of one member (or the whole run)."""

    calls: int = 0
    #: Calls that got no usable answer (retries ran out, refused, timed out, unreachable).
    failed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


@dataclass
class Reservation:
    """Room held for one call until it is settled."""

    tokens: int
    cost_usd: float
    max_tokens: int


@dataclass
class CostLedger:
    """Thread-safe running totals with caps; ``None`` caps mean unlimited."""

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    total: Usage = field(default_factory=Usage)
    by_member: dict[str, Usage] = field(default_factory=dict)
    #: UTF-8 bytes per prompt token assumed when reserving: conservative until a served prompt was
    #: seen, then 0.9 of the densest one seen (at most :data:`MAX_LEARNED_BYTES_PER_TOKEN`).
    chars_per_token: float = CONSERVATIVE_BYTES_PER_TOKEN
    #: Failed calls by kind (``transient``, ``timeout``, ``refused``, ``context``, ``unreachable``, ``fatal``).
    failures: Counter[str] = field(default_factory=Counter)
    _observed: bool = False
    _reserved_tokens: int = 0
    _reserved_cost: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def remaining_tokens(self) -> int | None:
        if self.max_tokens is None:
            return None
        return self.max_tokens - self.total.tokens - self._reserved_tokens

    def remaining_cost(self) -> float | None:
        if self.max_cost_usd is None:
            return None
        return self.max_cost_usd - self.total.cost_usd - self._reserved_cost

    @property
    def exhausted(self) -> bool:
        """True once a cap is reached (no further call can be made)."""
        tok, usd = self.remaining_tokens(), self.remaining_cost()
        return (tok is not None and tok <= 0) or (usd is not None and usd <= 0)

    def reserve(self, prompt_tokens: int, max_out: int, price: Price, min_out: int = 16) -> Reservation:
        """Hold room for a call; the completion limit shrinks to what is left, or the call is refused."""
        with self._lock:
            out = max_out
            tok = self.remaining_tokens()
            if tok is not None:
                out = min(out, tok - prompt_tokens)
            usd = self.remaining_cost()
            if usd is not None and price.output_per_mtok > 0:
                left = usd - price.cost(prompt_tokens, 0)
                out = min(out, math.floor(left * 1e6 / price.output_per_mtok))
            elif usd is not None and price.cost(prompt_tokens, 0) > usd:
                out = -1
            if out < min_out:
                raise LLMBudgetExhausted(self.why(prompt_tokens))
            res = Reservation(
                tokens=prompt_tokens + out, cost_usd=price.cost(prompt_tokens, out), max_tokens=out
            )
            self._reserved_tokens += res.tokens
            self._reserved_cost += res.cost_usd
            return res

    def settle(
        self, reservation: Reservation, member: str, tokens_in: int, tokens_out: int, cost: float
    ) -> None:
        """Release a reservation and add what the call really used."""
        with self._lock:
            self._reserved_tokens -= reservation.tokens
            self._reserved_cost -= reservation.cost_usd
            for usage in (self.total, self.by_member.setdefault(member, Usage())):
                usage.calls += 1
                usage.tokens_in += tokens_in
                usage.tokens_out += tokens_out
                usage.cost_usd += cost

    def observe_prompt(self, chars: int, tokens: int) -> None:
        """Learn from a served prompt (UTF-8 bytes, tokens the server counted): the first replaces the
        conservative prior, later ones can only make the estimate denser (always with a 10% margin)."""
        if tokens > 0 and chars > 0:
            density = min(MAX_LEARNED_BYTES_PER_TOKEN, 0.9 * chars / tokens)
            with self._lock:
                self.chars_per_token = density if not self._observed else min(self.chars_per_token, density)
                self._observed = True

    def fail(self, member: str, kind: str) -> None:
        """Count a call that got no usable answer."""
        with self._lock:
            self.failures[kind] += 1
            for usage in (self.total, self.by_member.setdefault(member, Usage())):
                usage.failed += 1

    def add(self, member: str, tokens_in: int, tokens_out: int, cost: float) -> None:
        """Count usage that happened outside a reservation (calls of a run before it was resumed)."""
        self.settle(Reservation(0, 0.0, 0), member, tokens_in, tokens_out, cost)

    def release(self, reservation: Reservation) -> None:
        """Release a reservation of a call that used nothing (it failed before an answer)."""
        with self._lock:
            self._reserved_tokens -= reservation.tokens
            self._reserved_cost -= reservation.cost_usd

    def why(self, prompt_tokens: int) -> str:
        """One line: what was spent against which cap."""
        parts = []
        if self.max_tokens is not None:
            parts.append(f"{self.total.tokens} of {self.max_tokens} tokens used")
        if self.max_cost_usd is not None:
            parts.append(f"${self.total.cost_usd:.4f} of ${self.max_cost_usd:.4f} spent")
        return f"LLM budget exhausted ({', '.join(parts)}; next prompt needs ~{prompt_tokens} tokens)"
