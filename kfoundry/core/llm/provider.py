"""The language-model generator: prompts built from a generation request, replies parsed into
proposals, proposals ranked for an ensemble vote.

:class:`LLMProvider` is a :class:`~kfoundry.core.generator.Generator` on top of
:class:`~kfoundry.core.llm.calls.ModelCaller` (one budgeted, retried, recorded call); providers
(``kfoundry.plugins.llms``) subclass it and implement ``_complete``, one HTTP attempt, with the
helpers of :mod:`kfoundry.core.llm.http`. The names the providers and the ensemble import from here
(options, errors, :class:`Completion`) are re-exported.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from kfoundry.core.generator import GenerationRequest, Generator
from kfoundry.core.llm.calls import Completion, ModelCaller
from kfoundry.core.llm.cost import LLMBudgetExhausted
from kfoundry.core.llm.errors import CallRefused, LLMError, ModelUnreachable
from kfoundry.core.llm.http import ContextRefusal, context_refusal
from kfoundry.core.llm.parsing import ParseFailure, parse_reply
from kfoundry.core.llm.prompts import Prompt, PromptBuilder
from kfoundry.core.llm.provider_options import ProviderOptions, check_base_url
from kfoundry.core.llm.recording import CallKind, request_key
from kfoundry.core.llm.retry import TransientError
from kfoundry.core.models import Candidate, Proposal

log = logging.getLogger(__name__)

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


class LLMProvider(ModelCaller, Generator):
    """A generator backed by a chat model; subclasses implement :meth:`ModelCaller._complete`."""

    def __init__(self, options: ProviderOptions) -> None:
        super().__init__(options)
        self.builder = PromptBuilder(options.templates)
        self._feedback: str = ""
        #: Set once the caps refused one of this provider's calls.
        self.budget_refused = False

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
    "CallRefused",
    "Completion",
    "ContextRefusal",
    "LLMBudgetExhausted",
    "LLMError",
    "LLMProvider",
    "ModelUnreachable",
    "ProviderOptions",
    "TransientError",
    "check_base_url",
    "context_refusal",
    "parse_ranking",
]
