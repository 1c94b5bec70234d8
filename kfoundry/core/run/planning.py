"""Planning a generation: the search strategy asks, the generator answers, every proposal is stored
before it is evaluated. Generation 0 asks the generator for seeds (plus the problem's naive seed
kernel, if it has one). Requests go out together when the generator allows several in flight; a
spent LLM budget keeps what was proposed before it and stops the run after this generation."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kfoundry.core.behaviour.space import DescriptorSpace
from kfoundry.core.candidate_file import read_candidate
from kfoundry.core.config import RunConfig, build_plugin
from kfoundry.core.db import loop as loop_db
from kfoundry.core.db.loop import Row
from kfoundry.core.ensemble import build_ensemble, calls_language_model
from kfoundry.core.errors import KfError
from kfoundry.core.generator import GenerationRequest, Generator, GeneratorUnsupported, ProblemSummary
from kfoundry.core.llm.cost import LLMBudgetExhausted
from kfoundry.core.models import Candidate, DeviceProfile, Proposal
from kfoundry.core.run.state import LoopError, Stop, StopKind
from kfoundry.core.search import SearchAsk, SearchStrategy
from kfoundry.core.store import Store


def build_generator(config: RunConfig, store: Store, run_id: str, run_dir: Path, language: str) -> Generator:
    """The run's generator: the ensemble over ``config.llms``, or a lone member that calls no language
    model itself (no ledger, recorder or prompts to share)."""
    if len(config.llms) == 1 and not calls_language_model(config.llms[0]):
        return build_plugin(config.llms[0], "llm")
    return build_ensemble(config, store, run_id=run_id, run_dir=run_dir, language=language)


def seed_count(config: RunConfig) -> int:
    """Proposals generation 0 asks for: ``proposals_per_generation`` when a language model is among the
    generators (each is a paid call), at least 8 when none is (free seeds)."""
    n = config.budget.proposals_per_generation
    return n if any(calls_language_model(choice) for choice in config.llms) else max(n, 8)


def propose_together(
    generator: Generator, requests: list[GenerationRequest], limit: int, *, seeds: bool = False
) -> list[list[Proposal] | KfError]:
    """``generator.propose`` (``seeds``: ``generator.seeds``) for every request, ``limit`` at a time
    (threads: the calls wait on the network); per request its proposals or the :class:`KfError` it
    raised, in request order."""

    def one(request: GenerationRequest) -> list[Proposal] | KfError:
        try:
            return generator.seeds(request) if seeds else generator.propose(request)
        except KfError as exc:
            return exc

    if limit <= 1 or len(requests) <= 1:
        return [one(r) for r in requests]
    with ThreadPoolExecutor(max_workers=min(len(requests), limit)) as pool:
        return list(pool.map(one, requests))


def _llm_stop(exc: KfError) -> Stop:
    return Stop(StopKind.LLM_BUDGET, f"LLM budget spent ({exc})")


class Planner:
    """Turns the strategy's asks into stored proposals, one generation at a time."""

    def __init__(
        self,
        config: RunConfig,
        generator: Generator,
        strategy: SearchStrategy,
        space: DescriptorSpace,
        store: Store,
        run_id: str,
        problem: ProblemSummary,
        language: str,
        device: DeviceProfile,
        *,
        seed_kernel: Path | None = None,
        initial_proposals: int | None = None,
    ) -> None:
        self.config, self.generator, self.strategy, self.space = config, generator, strategy, space
        self.store, self.run_id, self.problem, self.language, self.device = (
            store,
            run_id,
            problem,
            language,
            device,
        )
        self.seed_kernel, self.initial_proposals = seed_kernel, initial_proposals
        #: Set when the LLM budget ran out while planning: the run stops after this generation.
        self.llm_stop: Stop | None = None

    @property
    def concurrency(self) -> int:
        """Generator requests sent at once (the generator's own limit; 1 for non-LLM generators)."""
        return max(1, int(getattr(self.generator, "concurrency", 1)))

    def request(self, ask: SearchAsk, generation: int, index: int, avoid: set[str]) -> GenerationRequest:
        """What the generator is asked for one of the strategy's asks."""
        return GenerationRequest(
            problem=self.problem,
            language=self.language,
            device=self.device,
            mode=ask.mode,
            parent=ask.parent,
            inspirations=ask.inspirations,
            target_cell=ask.target_cell,
            n=1,
            seed=self.config.seed,
            generation=generation,
            extra={
                **ask.extra,
                "index": index,
                "avoid": sorted(avoid),
                "island": ask.island,
                "descriptors": self.space.describe(),
            },
        )

    def cell(self, candidate: Candidate | None) -> tuple[int, ...] | None:
        return self.space.cell(candidate) if candidate is not None else None

    def plan(self, generation: int) -> list[Row]:
        """Ask the strategy and the generator for this generation's proposals and store them."""
        avoid = loop_db.proposed_hashes(self.store, self.run_id)
        n = self.config.budget.proposals_per_generation
        pairs: list[tuple[SearchAsk, Proposal]] = []
        try:
            if generation == 0:
                pairs = self._seed_proposals(avoid)
            elif self.concurrency > 1:
                asks = list(self.strategy.ask(n))
                requests = [(a, self.request(a, generation, i, avoid)) for i, a in enumerate(asks)]
                pairs = self._propose_concurrently(requests)
            else:
                for i, ask in enumerate(self.strategy.ask(n)):
                    for p in self.generator.propose(self.request(ask, generation, i, avoid)):
                        pairs.append((ask, p))
                        if p.candidate is not None:
                            avoid.add(p.candidate.content_hash)
        except GeneratorUnsupported as exc:
            raise LoopError(str(exc)) from None
        except LLMBudgetExhausted as exc:
            if not pairs:
                raise
            self.llm_stop = _llm_stop(exc)  # keep what was proposed before the cap
        rows = [
            Row(
                generation=generation,
                idx=i,
                ask=ask,
                candidate=p.candidate,
                generator=p.generator,
                rationale=p.rationale,
                parse_error=p.parse_error,
                coords=self.cell(p.candidate),
            )
            for i, (ask, p) in enumerate(pairs)
        ]
        loop_db.insert_proposals(self.store, self.run_id, rows)
        return rows

    def _propose_concurrently(
        self, requests: list[tuple[SearchAsk, GenerationRequest]], seeds: bool = False
    ) -> list[tuple[SearchAsk, Proposal]]:
        """A generation's requests sent together (the providers cap calls in flight); proposals in
        request order. A spent LLM budget keeps what the other requests brought back."""
        answers = propose_together(self.generator, [r for _, r in requests], self.concurrency, seeds=seeds)
        pairs = [
            (ask, p)
            for (ask, _), got in zip(requests, answers, strict=True)
            if isinstance(got, list)
            for p in got
        ]
        errors = [e for e in answers if isinstance(e, KfError)]
        fatal = [e for e in errors if not isinstance(e, LLMBudgetExhausted)]
        if fatal or (errors and not pairs):
            raise (fatal or errors)[0]
        if errors:
            self.llm_stop = _llm_stop(errors[0])
        return pairs

    def _seed_proposals(self, avoid: set[str]) -> list[tuple[SearchAsk, Proposal]]:
        pairs: list[tuple[SearchAsk, Proposal]] = []
        ask = SearchAsk(mode="create", extra={"seed": True})
        if self.seed_kernel is not None:
            cand = read_candidate(self.seed_kernel).model_copy(
                update={"generator": "seed", "meta": {"seed": True}}
            )
            pairs.append(
                (
                    ask,
                    Proposal(
                        candidate=cand, generator="seed", rationale=f"naive seed {self.seed_kernel.name}"
                    ),
                )
            )
        n = self.initial_proposals or seed_count(self.config)
        request = self.request(ask, 0, 0, avoid).model_copy(update={"n": n})
        if self.concurrency > 1 and request.n > 1:  # one request per seed, sent together
            each = [
                request.model_copy(update={"n": 1, "extra": {**request.extra, "index": i}}) for i in range(n)
            ]
            return pairs + self._propose_concurrently([(ask, r) for r in each], seeds=True)
        pairs += [(ask, p) for p in self.generator.seeds(request)]
        return pairs
