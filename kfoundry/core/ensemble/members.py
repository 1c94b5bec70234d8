"""The :class:`Ensemble` generator: its members, their selection (weighted, UCB bandit, vote) and
what it learns from results; see :mod:`kfoundry.core.ensemble`."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kfoundry.core.db import llm as llm_db
from kfoundry.core.ensemble.observer import EnsembleObserver
from kfoundry.core.generator import GenerationRequest, Generator, GeneratorUnsupported
from kfoundry.core.llm.cost import CostLedger, LLMBudgetExhausted
from kfoundry.core.llm.meta import MetaPrompter, PromptArchive
from kfoundry.core.llm.novelty import NoveltyFilter
from kfoundry.core.llm.provider import LLMProvider, ModelUnreachable
from kfoundry.core.llm.recording import Recorder
from kfoundry.core.models import Candidate, EvalRecord, Proposal
from kfoundry.core.plugins import PluginManager
from kfoundry.core.store import Store

#: Cost charged to a free generator's proposal in bandit mode (so gain per cost stays finite).
FREE_COST = 1e-4


@dataclass
class Member:
    """One generator of the ensemble and its bandit statistics."""

    generator: Generator
    name: str
    weight: float = 1.0
    pulls: int = 0
    gain: float = 0.0
    cost: float = 0.0

    @property
    def is_llm(self) -> bool:
        return isinstance(self.generator, LLMProvider)

    @property
    def efficiency(self) -> float:
        """Fitness gain per unit cost observed so far."""
        return self.gain / self.cost if self.cost > 0 else 0.0


def borda(scores: list[list[float] | None], n: int) -> list[float]:
    """Borda points per proposal: each ranker gives a proposal one point per proposal it ranks above."""
    points = [0.0] * n
    for ranker in scores:
        if ranker is None or len(ranker) != n:
            continue
        for i in range(n):
            points[i] += sum(1.0 for j in range(n) if ranker[i] > ranker[j]) + 0.5 * sum(
                1.0 for j in range(n) if j != i and ranker[i] == ranker[j]
            )
    return points


def proposal_cost(p: Proposal) -> float:
    """What a proposal cost: dollars if priced, else a millionth per token, else :data:`FREE_COST`."""
    if p.cost_usd > 0:
        return p.cost_usd
    if p.tokens_in or p.tokens_out:
        return (p.tokens_in + p.tokens_out) * 1e-6
    return FREE_COST


class Ensemble(Generator):
    """Several generators acting as one."""

    name = "ensemble"

    def __init__(
        self,
        members: list[Member],
        mode: str = "sample",
        keep: int = 2,
        seed: int = 0,
        ledger: CostLedger | None = None,
        recorder: Recorder | None = None,
        prompts: PromptArchive | None = None,
        meta: MetaPrompter | None = None,
        novelty: NoveltyFilter | None = None,
        ucb_c: float = 1.0,
        store: Store | None = None,
        run_id: str | None = None,
    ) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members, self.mode, self.keep = members, mode, keep
        self.rng = random.Random(seed)
        self.ledger = ledger or CostLedger()
        self.recorder, self.prompts, self.meta, self.novelty = recorder, prompts, meta, novelty
        self.ucb_c = ucb_c
        #: Where the votes go (``llm_votes``) and under which run.
        self.store, self.run_id = store, run_id
        self.exhausted = False
        #: Why the ensemble stopped proposing ("" while it still can).
        self.stop_reason = ""
        self.votes: list[dict[str, Any]] = []
        #: Members whose server could not be reached on their last call.
        self.unreachable: set[str] = set()
        self._pending: dict[str, tuple[str, float, float]] = {}
        self._lock = threading.Lock()
        self._pick_lock = threading.Lock()
        self._observer_name: str | None = None
        self._manager: PluginManager | None = None

    # -- Generator ---------------------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        """Requests worth sending at once: the smallest member's concurrency limit (a request may go
        to any member, in vote mode to all); 1 while any member is not a language model, whose
        generator may not be thread-safe."""
        if not all(m.is_llm for m in self.members):
            return 1
        return min(int(getattr(m.generator, "concurrency", 1)) for m in self.members)

    def propose(self, request: GenerationRequest) -> list[Proposal]:
        """Proposals by the configured mode; none once the LLM budget is spent (see :attr:`stop_reason`)."""
        return self._generate(request, lambda g, r: g.propose(r))

    def seeds(self, request: GenerationRequest) -> list[Proposal]:
        return self._generate(request.model_copy(update={"mode": "create"}), lambda g, r: g.seeds(r))

    def rank(self, request: GenerationRequest, proposals: list[Proposal]) -> list[float] | None:
        """Borda points of every member's ranking (None if every member abstains)."""
        scores = self._rank_all(request, proposals)
        return borda(scores, len(proposals)) if any(s is not None for s in scores) else None

    def _exhaust(self, exc: LLMBudgetExhausted) -> None:
        if not self.exhausted:
            self.exhausted = True
            self.stop_reason = str(exc)

    # -- modes -------------------------------------------------------------------------------------

    def _generate(
        self, request: GenerationRequest, call: Callable[[Generator, GenerationRequest], list[Proposal]]
    ) -> list[Proposal]:
        if self.exhausted or (self.ledger.exhausted and all(m.is_llm for m in self.members)):
            self._exhaust(LLMBudgetExhausted(self.ledger.why(0)))
            return []
        with self._pick_lock:  # requests of a generation may come from several threads at once
            request = self._with_prompt(request)
        if self.mode == "vote":
            return self._vote(request, call)
        counts: dict[int, int] = {}
        with self._pick_lock:
            for _ in range(request.n):
                idx = self._pick_bandit() if self.mode == "bandit" else self._pick_weighted()
                counts[idx] = counts.get(idx, 0) + 1
        out: list[Proposal] = []
        for idx in sorted(counts):
            out += self._ask(self.members[idx], request.model_copy(update={"n": counts[idx]}), call)
        with self._pick_lock:
            return self._admit(request, out)

    def _ask(
        self, member: Member, request: GenerationRequest, call: Callable[..., list[Proposal]]
    ) -> list[Proposal]:
        """One member's proposals; an exhausted budget or an unsupported problem yields none."""
        if self.exhausted and member.is_llm:
            return []
        try:
            props = call(member.generator, request)
        except LLMBudgetExhausted as exc:
            self._exhaust(exc)
            return []
        except GeneratorUnsupported:
            return []
        except ModelUnreachable:  # the run stops only when no member can be reached
            self.unreachable.add(member.name)
            if all(m.name in self.unreachable for m in self.members):
                raise
            return []
        self.unreachable.discard(member.name)
        if getattr(member.generator, "budget_refused", False):
            self._exhaust(LLMBudgetExhausted(self.ledger.why(0)))
        for p in props:
            p.generator = member.name
            if p.candidate is not None:
                p.candidate.generator = member.name
                p.candidate.prompt_id = p.candidate.prompt_id or request.prompt_id
            p.prompt_id = p.prompt_id or request.prompt_id
        return props

    def _pick_weighted(self) -> int:
        usable = [i for i, m in enumerate(self.members) if not (m.is_llm and self.exhausted)] or [0]
        weights = [self.members[i].weight for i in usable]
        return self.rng.choices(usable, weights=weights)[0]

    def _pick_bandit(self) -> int:
        """UCB1 on normalised gain per cost; the weight scales the exploration bonus."""
        with self._lock:
            for i, m in enumerate(self.members):
                if m.pulls == 0:
                    m.pulls += 1  # counts as pulled once asked, so one request spreads over members
                    return i
            total = sum(m.pulls for m in self.members)
            top = max((m.efficiency for m in self.members), default=0.0) or 1.0
            ucb = [
                m.efficiency / top + self.ucb_c * math.sqrt(m.weight) * math.sqrt(math.log(total) / m.pulls)
                for m in self.members
            ]
            best = max(range(len(ucb)), key=lambda i: (ucb[i], -i))
            self.members[best].pulls += 1
            return best

    def _vote(self, request: GenerationRequest, call: Callable[..., list[Proposal]]) -> list[Proposal]:
        each = request.model_copy(update={"n": math.ceil(request.n / len(self.members))})
        batches = self._each(lambda m: self._ask(m, each, call))
        with self._pick_lock:
            pooled = self._admit(request, [p for batch in batches for p in batch])
        failed = [p for p in pooled if p.candidate is None]
        valid = [p for p in pooled if p.candidate is not None]
        keep = min(self.keep, request.n)
        if len(valid) <= keep:
            self._record_vote(request, valid, [], [0.0] * len(valid), list(range(len(valid))))
            return valid + failed
        scores = self._rank_all(request, valid)
        points = borda(scores, len(valid))
        order = sorted(range(len(valid)), key=lambda i: (-points[i], i))
        kept = sorted(order[:keep])
        self._record_vote(request, valid, scores, points, kept)
        return [valid[i] for i in kept] + failed

    def _rank_all(self, request: GenerationRequest, proposals: list[Proposal]) -> list[list[float] | None]:
        def one(m: Member) -> list[float] | None:
            if m.is_llm and self.exhausted:
                return None
            try:
                scores = m.generator.rank(request, proposals)
            except LLMBudgetExhausted as exc:
                self._exhaust(exc)
                return None
            return scores if scores is not None and len(scores) == len(proposals) else None

        return self._each(one)

    def _each(self, fn: Callable[[Member], Any]) -> list[Any]:
        """``fn`` for every member, in member order: in parallel threads unless a budget cap is set
        (then one after another, so the cap cuts at the same call in every run and in a replay)."""
        capped = self.ledger.max_tokens is not None or self.ledger.max_cost_usd is not None
        if capped or len(self.members) == 1:
            return [fn(m) for m in self.members]
        with ThreadPoolExecutor(max_workers=len(self.members)) as pool:
            return list(pool.map(fn, self.members))

    def _record_vote(
        self,
        request: GenerationRequest,
        valid: list[Proposal],
        scores: list[list[float] | None],
        points: list[float],
        kept: list[int],
    ) -> None:
        proposed = [[p.generator, p.candidate.content_hash if p.candidate else None] for p in valid]
        by_member = {m.name: s for m, s in zip(self.members, scores, strict=True)} if scores else {}
        vote = {"generation": request.generation, "proposals": proposed, "scores": by_member, "points": points,
                "kept": kept}  # fmt: skip
        self.votes.append(vote)
        if self.store is not None:
            llm_db.insert_vote(self.store, self.run_id, request.generation, proposed, by_member, points, kept)

    # -- prompts and novelty ------------------------------------------------------------------------

    def _with_prompt(self, request: GenerationRequest) -> GenerationRequest:
        if self.prompts is None or request.prompt_sections:
            return request
        variant = self.prompts.select()
        return request.model_copy(
            update={"prompt_sections": self.prompts.sections_for(variant), "prompt_id": variant.id}
        )

    def _admit(self, request: GenerationRequest, proposals: list[Proposal]) -> list[Proposal]:
        """Drop near-duplicates of anything proposed before; remember what each proposal cost."""
        parent_fitness = request.parent.record.fitness if request.parent and request.parent.record else 0.0
        out = []
        for p in proposals:
            c = p.candidate
            if (
                c is not None
                and self.novelty is not None
                and not self.novelty.admit(c.source, dict(c.params))
            ):
                continue
            if c is not None:
                with self._lock:
                    self._pending[c.content_hash] = (p.generator, parent_fitness, proposal_cost(p))
            out.append(p)
        return out

    # -- learning from results ----------------------------------------------------------------------

    def observe(self, candidate: Candidate, record: EvalRecord) -> None:
        """Credit the member (bandit) and the prompt (meta-prompting) with an evaluation's result."""
        if self.novelty is not None:
            self.novelty.add(candidate.source, dict(candidate.params))
        if self.prompts is not None:
            self.prompts.observe(candidate.prompt_id, record)
        with self._lock:
            pending = self._pending.pop(candidate.content_hash, None)
            if pending is None:
                return
            name, parent_fitness, cost = pending
            for m in self.members:
                if m.name == name:
                    m.gain += max(0.0, record.fitness - parent_fitness)
                    m.cost += cost

    def end_generation(self, generation: int) -> None:
        """Run the meta-prompter when it is due (a spent budget skips it)."""
        if self.meta is not None and not self.exhausted and self.meta.due(generation):
            try:
                self.meta.step(generation)
            except LLMBudgetExhausted as exc:
                self._exhaust(exc)

    def usage(self) -> dict[str, Any]:
        """Tokens and money so far, in total and per member."""
        t = self.ledger.total
        return {
            "calls": t.calls,
            "failed": t.failed,
            "failures": dict(self.ledger.failures),
            "tokens_in": t.tokens_in,
            "tokens_out": t.tokens_out,
            "cost_usd": t.cost_usd,
            "members": {k: vars(v) for k, v in self.ledger.by_member.items()},
            "exhausted": self.exhausted,
        }

    # -- hook observer ------------------------------------------------------------------------------

    def attach(self, manager: PluginManager) -> None:
        """Observe evaluations and generations through the lifecycle hooks of ``manager``."""
        name = f"kfoundry-ensemble-{id(self):x}"
        manager.add_plugin(EnsembleObserver(self, manager, name), name, package="kfoundry", version="")
        self._observer_name, self._manager = name, manager

    def detach(self) -> None:
        if self._manager is not None and self._observer_name is not None:
            self._manager.remove_plugin(self._observer_name)
            self._observer_name = None
