"""Meta-prompting: an archive of prompt variants, their rewriting by a model, and error distillation.

Each variant is a full set of evolvable sections; its fitness is the best kernel it produced.
Every N generations the meta-model rewrites one section of the best variant (round robin), which
becomes a new variant. Recurring failures (compile errors, anti-cheat rejections, parse failures)
are reduced to patterns; a pattern seen ``threshold`` times becomes a bullet in every prompt's
pitfalls section, and the meta-model sees the counts when it rewrites pitfalls.
"""

from __future__ import annotations

import random
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kfoundry.core.db import llm as llm_db
from kfoundry.core.llm.parsing import ParseFailure, apply_diff, code_blocks, diff_blocks
from kfoundry.core.llm.prompts import PromptBuilder
from kfoundry.core.llm.sections import DEFAULT_SECTIONS
from kfoundry.core.models import EvalRecord, Outcome, stable_hash
from kfoundry.core.store import Store

if TYPE_CHECKING:
    from kfoundry.core.llm.provider import LLMProvider

#: Outcomes whose messages feed the pitfalls section.
LEARN_FROM = {
    Outcome.compile_error,
    Outcome.rejected,
    Outcome.runtime_error,
    Outcome.timeout,
    Outcome.parse_error,
}


@dataclass
class PromptVariant:
    """One set of evolvable sections and how it fared."""

    sections: dict[str, str]
    parent_id: str | None = None
    generation: int = 0
    section: str | None = None
    uses: int = 0
    best_fitness: float | None = None
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def id(self) -> str:
        return "p-" + stable_hash(sorted(self.sections.items()))[:12]


#: What differs between two occurrences of one error: temporary names (PoCL's
#: ``tempfile_XXXX.cl``, Python's ``tmpab12cd34``), absolute paths, addresses, long hashes, then
#: where in the file it was (``<file>:13:25:``, ``line 13:25:``) and the leading ``error:``.
_TEMP = re.compile(r"\b(?:tempfile|tmp|temp)[_-]?[A-Za-z0-9]{4,}\w*", re.IGNORECASE)
_PATH = re.compile(r"(?<![\w.>])(?:[A-Za-z]:)?(?:[/\\][\w.@+~<>-]+)+")
_ADDR = re.compile(r"\b0x[0-9a-f]{4,}\b", re.IGNORECASE)
_HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{12,}\b", re.IGNORECASE)
_SOURCE = re.compile(r"\b[\w.-]+\.(?:cl|cu|cuh|cpp|cc|c|h|hpp|hip|py)(?=[:(])")
_LOCATION = re.compile(
    r"(?:<file>|\bline)\s*(?::\s*\d+(?::\d+)?:?|\(\d+\)\s*:?|\s\d+(?::\d+)?:?)\s*", re.IGNORECASE
)
_LEAD = re.compile(r"^(?:(?:fatal )?error|warning)\s*:\s*", re.IGNORECASE)


def normalise_error(text: str) -> str:
    """One error line without what changes between occurrences (temp names, paths, addresses, hashes,
    file positions), so identical errors read identically: ``error: /root/.cache/pocl/kcache/
    tempfile_Ab12Cd.cl:13:25: use of undeclared identifier 'x'`` -> ``use of undeclared identifier 'x'``."""
    text = " ".join(text.split())[:400]
    text = _TEMP.sub("<tmp>", text)
    text = _PATH.sub("<file>", text)
    text = _SOURCE.sub("<file>", text)
    text = _ADDR.sub("<addr>", text)
    text = _HASH.sub("<hash>", text)
    text = _LOCATION.sub("", text)
    return _LEAD.sub("", text).strip()


def error_pattern(record: EvalRecord) -> tuple[str, str] | None:
    """(pattern, example) for a failure worth learning from; the pattern hides numbers and names,
    the example is the normalised error line (see :func:`normalise_error`)."""
    if record.outcome not in LEARN_FROM:
        return None
    text = record.message or ""
    if record.outcome is Outcome.compile_error:
        lines = [x for x in (record.log or text).splitlines() if re.search(r"\berror\b", x, re.IGNORECASE)]
        text = lines[0] if lines else text
    text = normalise_error(text)[:200]
    if not text:
        return None
    pattern = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "'X'", text)
    pattern = re.sub(r"\d+(\.\d+)?", "N", pattern)
    return f"{record.outcome.value}: {pattern.lower()[:120]}", text


class ErrorPatterns:
    """Counts failure patterns; those seen ``threshold`` times become pitfalls."""

    def __init__(self, threshold: int = 3, max_pitfalls: int = 6) -> None:
        self.threshold = threshold
        self.max_pitfalls = max_pitfalls
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def add(self, record: EvalRecord) -> None:
        found = error_pattern(record)
        if found:
            self.counts[found[0]] += 1
            self.examples.setdefault(found[0], found[1])

    def pitfalls(self) -> list[str]:
        """Bullets for the recurring patterns, most frequent first."""
        common = [(p, n) for p, n in self.counts.most_common() if n >= self.threshold][: self.max_pitfalls]
        return [
            f"- Seen {n} times in this run ({p.split(':')[0]}): {self.examples[p][:160]}" for p, n in common
        ]


class PromptArchive:
    """Prompt variants with their fitness; picks the variant a request uses."""

    def __init__(
        self,
        seed: int = 0,
        store: Store | None = None,
        run_id: str | None = None,
        explore: float = 0.2,
        min_uses: int = 2,
        base: dict[str, str] | None = None,
    ) -> None:
        self.variants: dict[str, PromptVariant] = {}
        self.rng = random.Random(seed)
        self.store, self.run_id = store, run_id
        self.explore, self.min_uses = explore, min_uses
        self.errors = ErrorPatterns()
        self._lock = threading.Lock()
        if store is not None:
            self._reload()
        self.add(PromptVariant(dict(base or DEFAULT_SECTIONS)))

    def _reload(self) -> None:
        """Variants a resumed run had already made, with their counts and fitness."""
        assert self.store is not None
        for r in llm_db.prompt_variants(self.store, self.run_id):
            v = PromptVariant(
                r["sections"],
                parent_id=r["parent_id"],
                generation=r["generation"],
                section=r["section"],
                uses=r["uses"],
                best_fitness=r["best_fitness"],
                outcomes=Counter(r["outcomes"]),
            )
            self.variants[v.id] = v

    def add(self, variant: PromptVariant) -> PromptVariant:
        with self._lock:
            existing = self.variants.get(variant.id)
            if existing is not None:
                return existing
            self.variants[variant.id] = variant
        self._save(variant)
        return variant

    def select(self) -> PromptVariant:
        """A fresh variant until it has been tried ``min_uses`` times, else the best (or a random one)."""
        with self._lock:
            variants = list(self.variants.values())
            fresh = [v for v in variants if v.uses < self.min_uses]
            if fresh:
                chosen = fresh[-1]
            elif self.rng.random() < self.explore:
                chosen = self.rng.choice(variants)
            else:
                chosen = self.best()
            chosen.uses += 1
        self._save(chosen)
        return chosen

    def best(self) -> PromptVariant:
        return max(self.variants.values(), key=lambda v: (v.best_fitness or -1.0, -v.uses))

    def sections_for(self, variant: PromptVariant) -> dict[str, str]:
        """The variant's sections with the learned pitfalls appended."""
        sections = dict(variant.sections)
        learned = self.errors.pitfalls()
        if learned:
            sections["pitfalls"] = (sections.get("pitfalls", "").rstrip() + "\n" + "\n".join(learned)).strip()
        return sections

    def observe(self, prompt_id: str | None, record: EvalRecord) -> None:
        """Credit a prompt with an evaluation's fitness; learn from its failure."""
        self.errors.add(record)
        variant = self.variants.get(prompt_id or "")
        if variant is None:
            return
        with self._lock:
            variant.outcomes[record.outcome.value] += 1
            if variant.best_fitness is None or record.fitness > variant.best_fitness:
                variant.best_fitness = record.fitness
        self._save(variant)

    def _save(self, v: PromptVariant) -> None:
        if self.store is None:
            return
        llm_db.save_prompt_variant(
            self.store,
            self.run_id,
            v.id,
            parent_id=v.parent_id,
            generation=v.generation,
            section=v.section,
            sections=v.sections,
            uses=v.uses,
            best_fitness=v.best_fitness,
            outcomes=dict(v.outcomes),
        )


def rewrite_section(reply: str, current: str) -> str:
    """The new section text from a meta-model reply (diffs on the text, a ```text block, or plain)."""
    diffs = diff_blocks(reply)
    if diffs:
        text = current
        for search, replace in diffs:
            text = apply_diff(text, search, replace)
        return text.strip()
    blocks = code_blocks(reply)
    if blocks:
        return max((b for _, b in blocks), key=len).strip()
    raise ParseFailure("the meta reply holds neither SEARCH/REPLACE blocks nor a code block")


class MetaPrompter:
    """Every ``every`` generations, has ``model`` rewrite one section of the best prompt variant."""

    def __init__(
        self,
        model: LLMProvider,
        archive: PromptArchive,
        every: int,
        language: str = "opencl",
        builder: PromptBuilder | None = None,
        max_chars: int = 3000,
    ) -> None:
        self.model, self.archive, self.every = model, archive, every
        self.language = language
        self.builder = builder or PromptBuilder()
        self.max_chars = max_chars
        self._turn = len(archive.variants) - 1  # a resumed run goes on with the next section
        self.rewrites: list[dict[str, Any]] = []

    def due(self, generation: int) -> bool:
        return self.every > 0 and generation > 0 and generation % self.every == 0

    def step(self, generation: int) -> PromptVariant | None:
        """Rewrite one section; the new variant, or None if the reply was unusable or the call failed."""
        parent = self.archive.best()
        names = list(parent.sections)
        section = names[self._turn % len(names)]
        self._turn += 1
        stats: dict[str, Any] = {
            "kernels produced with these instructions": sum(parent.outcomes.values()),
            "outcomes": dict(parent.outcomes) or "none yet",
            "best fitness (stage score 0-5 plus speedup)": parent.best_fitness,
        }
        if section == "pitfalls" and self.archive.errors.counts:
            stats["recurring failures"] = "; ".join(
                f"{n}x {self.archive.errors.examples[p][:120]}"
                for p, n in self.archive.errors.counts.most_common(5)
            )
        prompt = self.builder.meta(section, parent.sections[section], stats, self.language)
        key = stable_hash("meta", parent.id, section, generation)
        reply = self.model.complete_text(prompt, key, kind="meta", generation=generation)
        if reply is None:
            return None
        try:
            text = rewrite_section(reply, parent.sections[section])[: self.max_chars]
        except ParseFailure:
            return None
        if not text or text == parent.sections[section]:
            return None
        child = PromptVariant(
            {**parent.sections, section: text}, parent_id=parent.id, generation=generation, section=section
        )
        child = self.archive.add(child)
        self.rewrites.append(
            {"generation": generation, "section": section, "parent": parent.id, "child": child.id}
        )
        return child
