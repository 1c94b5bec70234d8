"""Every language-model call, recorded: prompt, response, tokens, cost, latency and errors.

Calls go to the run's store (table ``llm_calls``, through :mod:`kfoundry.core.db.llm`) and to an append-only JSON-lines file (the
``recording`` a ``replay`` provider serves from). API keys never reach either: only the prompt and
the reply text are kept. Each call carries a *request key*: a hash of what was asked (member, kind
and the request's structure, not measured times) plus an occurrence count, which is what replay
looks calls up by.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from kfoundry.core.db import llm as llm_db
from kfoundry.core.generator import GenerationRequest
from kfoundry.core.models import Proposal, stable_hash
from kfoundry.core.store import Store

CallKind = Literal["generate", "rank", "meta"]
#: ``transient`` (retries ran out), ``timeout`` (the last attempt timed out), ``refused`` (this
#: request only), ``context`` (refused: too long for the model's context), ``unreachable`` (no
#: answer from the server: the run stopped here), ``fatal`` (stops the run) or ``budget`` (never
#: sent: the caps leave no room; ``max_tokens`` then holds the prompt estimate).
ErrorKind = Literal["transient", "timeout", "refused", "context", "unreachable", "fatal", "budget"]
#: Calls that do not count as asked: a resumed run (and a replay) asks them again.
NOT_ASKED = ("budget", "unreachable")


class CallRecord(BaseModel):
    """One call to a language model (a failed one has ``error`` and no ``response``)."""

    run_id: str | None = None
    seq: int = 0
    member: str
    provider: str
    model: str
    kind: CallKind
    request_key: str
    occurrence: int = 0
    prompt_hash: str
    system: str
    prompt: str
    response: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    attempts: int = 1
    error: str | None = None
    error_kind: ErrorKind | None = None
    generation: int | None = None
    max_tokens: int = 0
    price_in: float = 0.0
    price_out: float = 0.0
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat())


def _attempt_key(attempt: Any) -> Any:
    if attempt is None:
        return None
    rec = attempt.record
    return [attempt.candidate.content_hash, rec.outcome.value if rec else None, attempt.cell]


def request_key(
    member: str,
    kind: CallKind,
    request: GenerationRequest | None = None,
    proposals: list[Proposal] | None = None,
    extra: Any = None,
) -> str:
    """Hash of what a call asks: the request's structure without measured times (stable across runs)."""
    structure: Any = None
    if request is not None:
        structure = [
            request.problem.name,
            request.problem.shapes,
            request.language,
            request.device.key,
            request.mode,
            _attempt_key(request.parent),
            [_attempt_key(a) for a in request.inspirations],
            request.target_cell,
            sorted(request.prompt_sections.items()),
            request.generation,
            request.extra.get("reply_feedback", ""),
        ]
    hashes = [p.candidate.content_hash if p.candidate else None for p in proposals or []]
    return stable_hash(member, kind, structure, hashes, extra)


class Recorder:
    """Writes :class:`CallRecord` rows to the store and/or a JSON-lines file; thread-safe."""

    def __init__(
        self, store: Store | None = None, path: str | Path | None = None, run_id: str | None = None
    ) -> None:
        self.store = store
        self.path = Path(path) if path else None
        self.run_id = run_id
        self._lock = threading.Lock()
        self._seq = 0
        self._occurrences: Counter[tuple[str, str]] = Counter()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        #: Calls this run made before (a resumed run continues its numbering, counts and budget).
        self.previous: list[CallRecord] = self._previous_calls()
        for call in self.previous:
            self._seq = max(self._seq, call.seq)
            if call.error_kind not in NOT_ASKED:
                self._occurrences[(call.member, call.request_key)] += 1

    def _previous_calls(self) -> list[CallRecord]:
        if self.store is None or self.run_id is None:
            return []
        rows = llm_db.previous_calls(self.store, self.run_id)
        return [CallRecord(system="", prompt="", **r) for r in rows]

    def occurrence(self, member: str, key: str) -> int:
        """How many calls with this key this member made before (0 for the first); counts this one."""
        with self._lock:
            n = self._occurrences[(member, key)]
            self._occurrences[(member, key)] += 1
            return n

    def forget(self, member: str, key: str) -> None:
        """Undo :meth:`occurrence` for a call that stopped the run before it was answered."""
        with self._lock:
            if self._occurrences[(member, key)] > 0:
                self._occurrences[(member, key)] -= 1

    def record(self, call: CallRecord) -> CallRecord:
        """Assign the next sequence number and write the call everywhere."""
        with self._lock:
            self._seq += 1
            call = call.model_copy(update={"seq": self._seq, "run_id": call.run_id or self.run_id})
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as fh:
                    fh.write(call.model_dump_json() + "\n")
            if self.store is not None:
                llm_db.insert_call(self.store, call)
            return call


def load_recording(source: str | Path) -> list[CallRecord]:
    """Calls from a JSON-lines recording, a run directory holding ``llm_calls.jsonl``, or a store file."""
    path = Path(source)
    if path.is_dir():
        path = path / RECORDING_NAME
    if not path.is_file():
        from kfoundry.core.errors import ConfigError

        raise ConfigError(f"replay: no recording at {path}")
    if path.suffix in (".sqlite", ".db", ".sqlite3"):
        return [CallRecord.model_validate(call) for call in llm_db.read_calls(path)]
    return [CallRecord.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


#: File name of the JSON-lines recording inside a run directory.
RECORDING_NAME = "llm_calls.jsonl"
