"""The ``replay`` provider: serves a recorded run's replies, so the run reproduces without any API.

Each call is looked up by (member, kind, request key, occurrence) in the recording (a run
directory, its ``llm_calls.jsonl`` or its store file); tokens and cost come from the recording, so
budget caps stop the replay exactly where they stopped the original. A call that was never
recorded is an error (``on_miss = "error"``) or takes the member's next unused recorded reply of
the same kind (``on_miss = "sequence"``).
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from typing import Literal

from pydantic import Field

from kfoundry import hookimpl
from kfoundry.core.errors import KfError
from kfoundry.core.hookspecs import Register
from kfoundry.core.llm.cost import Price
from kfoundry.core.llm.prompts import Prompt
from kfoundry.core.llm.provider import CallRefused, Completion, LLMError, LLMProvider, ProviderOptions
from kfoundry.core.llm.recording import NOT_ASKED, CallKind, CallRecord, load_recording
from kfoundry.core.llm.retry import RetriesExhausted


class ReplayMiss(KfError):
    """The replayed run asked something the recording does not hold."""


class ReplayOptions(ProviderOptions):
    """Options of the ``replay`` provider."""

    recording: str = Field(description="Run directory, llm_calls.jsonl, or store file of the recorded run.")
    member: str | None = Field(
        default=None,
        description="Recorded member to impersonate, e.g. 'openai:gpt-5-mini' (None: the only one).",
    )
    on_miss: Literal["error", "sequence"] = Field(
        default="error", description="A call missing from the recording: fail, or take the next recorded one."
    )


class ReplayProvider(LLMProvider):
    """Replays recorded replies (no network)."""

    provider = "replay"
    default_model = "replay"

    def __init__(self, options: ReplayOptions) -> None:
        super().__init__(options)
        self.options: ReplayOptions = options
        calls = load_recording(options.recording)
        members = sorted({c.member for c in calls})
        member = options.member or (members[0] if len(members) == 1 else None)
        if member is None or member not in members:
            raise KfError(
                f"replay: choose options.member among the recorded members ({', '.join(members) or 'none'})"
            )
        self.name = member
        mine = [c for c in calls if c.member == member and c.error_kind not in NOT_ASKED]
        if not mine:
            raise KfError(f"replay: the recording holds no call of {member} that was sent")
        self.model = mine[0].model
        self._price = Price(input_per_mtok=mine[0].price_in, output_per_mtok=mine[0].price_out)
        self._max_tokens = max(c.max_tokens for c in mine) or options.max_tokens
        self._by_key: dict[tuple[str, str, int], CallRecord] = {
            (c.kind, c.request_key, c.occurrence): c for c in mine
        }
        self._queues: dict[str, deque[CallRecord]] = defaultdict(deque)
        for c in mine:
            self._queues[c.kind].append(c)
        self._lock = threading.Lock()
        self.misses = 0

    @property
    def price(self) -> Price:
        return self._price

    def configure(self, *, model: str | None = None, name: str | None = None, **kw: object) -> ReplayProvider:
        """The recorded member's name and model always win (provenance must match the recording)."""
        return super().configure(**kw)  # type: ignore[arg-type]

    def api_key(self) -> str:
        return "not-needed"

    def _fetch(
        self, kind: CallKind, key: str, occurrence: int, prompt: Prompt, max_tokens: int
    ) -> tuple[Completion, int]:
        with self._lock:
            call = self._by_key.get((kind, key, occurrence))
            if call is None:
                self.misses += 1
                if self.options.on_miss == "error" or not self._queues[kind]:
                    raise ReplayMiss(
                        f"replay: {self.name} {kind} call (key {key}, occurrence {occurrence}) is not in the recording"
                    )
                call = self._queues[kind][0]
            if call in self._queues[kind]:
                self._queues[kind].remove(call)
        if call.error is not None:
            if call.error_kind == "fatal":
                raise LLMError(call.error)
            if call.error_kind == "refused":
                raise CallRefused(call.error)
            raise RetriesExhausted(call.error, ["(recorded failure)"] * call.attempts)
        return Completion(
            call.response or "", call.tokens_in, call.tokens_out, "", call.cost_usd
        ), call.attempts


@hookimpl
def kf_register_llms(register: Register) -> None:
    register(
        "replay", ReplayProvider, options=ReplayOptions, description="Replay a recorded run's LLM replies"
    )
