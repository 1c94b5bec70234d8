"""Token and money accounting for language-model calls, with hard caps checked before every call.

One :class:`CostLedger` is shared by every member of an ensemble (and the meta-prompter), so the
caps in ``budget.llm_tokens`` / ``budget.llm_cost_usd`` hold for the whole run. Before a call the
ledger *reserves* the worst case (estimated prompt tokens plus the completion limit); a call whose
worst case does not fit is refused, so the totals never exceed a cap.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

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


def estimate_tokens(text: str, chars_per_token: float = 3.0) -> int:
    """A conservative token estimate (3 characters per token unless the run has seen denser text)."""
    return max(1, math.ceil(len(text) / chars_per_token))


@dataclass
class Usage:
    """Totals of one member (or the whole run)."""

    calls: int = 0
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
    #: Characters per prompt token assumed when reserving: 3, or less once a denser prompt was seen.
    chars_per_token: float = 3.0
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
        """Learn from a served prompt: if it was denser than assumed, assume denser (with 10% margin)."""
        if tokens > 0 and chars > 0:
            with self._lock:
                self.chars_per_token = min(self.chars_per_token, 0.9 * chars / tokens)

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
