"""The generator contract (plugin kind ``llm``): turn a structured request into kernel proposals.

LLM providers render a :class:`GenerationRequest` to text (Jinja2 templates) and parse the reply;
the offline generator reads the structure directly. Both return :class:`Proposal` objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kfoundry.core.models import Candidate, DeviceProfile, EvalRecord, Language, Proposal


class ProblemSummary(BaseModel):
    """What a generator needs to know about the problem."""

    model_config = ConfigDict(extra="forbid")

    name: str
    format: Literal["kernelbench", "native"] = "kernelbench"
    #: The reference source (the KernelBench file, or the native task's reference function).
    reference_source: str
    #: Module-level shape constants in force (after overrides).
    shapes: dict[str, int | float] = Field(default_factory=dict)
    input_shapes: list[list[int]] = Field(default_factory=list)
    input_dtypes: list[str] = Field(default_factory=list)
    output_shapes: list[list[int]] = Field(default_factory=list)
    bytes_moved: int | None = None
    flops: float | None = None
    path: str | None = None


class Attempt(BaseModel):
    """A kernel tried before, with its verdict (parent or inspiration)."""

    candidate: Candidate
    record: EvalRecord | None = None
    cell: tuple[int, ...] | None = None


class GenerationRequest(BaseModel):
    """A structured request for proposals."""

    problem: ProblemSummary
    language: Language
    device: DeviceProfile
    mode: Literal["create", "improve", "repair"] = "create"
    parent: Attempt | None = None
    inspirations: list[Attempt] = Field(default_factory=list)
    #: Archive cell (behaviour descriptor coordinates) the search would like filled.
    target_cell: tuple[int, ...] | None = None
    #: Evolvable prompt sections: name -> text (philosophy, strategies, pitfalls, analysis).
    prompt_sections: dict[str, str] = Field(default_factory=dict)
    prompt_id: str | None = None
    #: How many proposals are wanted.
    n: int = Field(default=1, ge=1)
    seed: int = 0
    generation: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)


class GeneratorUnsupported(Exception):
    """The generator cannot handle this problem (the offline generator for an unknown operation)."""


class Generator(ABC):
    """A source of kernel proposals: an LLM provider or the offline generator."""

    #: Registered name, set by the factory.
    name: str = "generator"

    @abstractmethod
    def propose(self, request: GenerationRequest) -> list[Proposal]:
        """Return up to ``request.n`` proposals (a failed parse is a proposal with ``parse_error``)."""

    def rank(self, request: GenerationRequest, proposals: list[Proposal]) -> list[float] | None:
        """Score proposals for an ensemble vote (higher is better); None: this generator abstains."""
        return None

    def seeds(self, request: GenerationRequest) -> list[Proposal]:
        """Initial proposals for an empty archive (default: ``propose`` in create mode)."""
        return self.propose(request.model_copy(update={"mode": "create"}))

    def check(self, problem: ProblemSummary, language: str) -> None:
        """Raise :class:`GeneratorUnsupported` (one line) if this generator cannot handle ``problem`` at all
        (default: it can). Called before a run folder exists, so it must not load the problem's inputs."""
        return None


def refuse_unsupported(generators: list[Generator], problem: ProblemSummary, language: str) -> None:
    """Raise the first refusal when every generator in ``generators`` refuses ``problem`` (their ``check``)."""
    refusals: list[str] = []
    for generator in generators:
        try:
            generator.check(problem, language)
        except GeneratorUnsupported as exc:
            refusals.append(str(exc))
        else:
            return
    if refusals:
        raise GeneratorUnsupported(refusals[0])
