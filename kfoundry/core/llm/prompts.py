"""Render generation, ranking and meta-prompting requests to chat messages (Jinja2 templates).

One template per backend language (``templates/{opencl,cuda,sycl,hip}.j2``) extends ``base.j2``
with that language's vocabulary, rules and a worked ``ModelNew`` example, so every prompt teaches
the ``kfoundry.runtime.load`` launch convention in the words of its hardware.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jinja2

from kfoundry.core.behaviour.axes import axis_descriptions
from kfoundry.core.errors import KfError
from kfoundry.core.generator import Attempt, GenerationRequest
from kfoundry.core.llm.sections import DEFAULT_SECTIONS, SECTION_TITLES
from kfoundry.core.models import DeviceProfile, Proposal

#: Names and levels of the behaviour descriptors (the archive's cell coordinates).
DESCRIPTORS: list[tuple[str, list[str]]] = [
    (
        "memory",
        [
            "naive global accesses",
            "coalesced / vectorised",
            "local-memory tiling",
            "register blocking + double buffering",
        ],
    ),
    (
        "compute",
        ["multi-pass", "fused / FMA", "single-pass / streaming / online", "tiled / blocked algorithm"],
    ),
    ("parallelism", ["work-item only", "work-group barriers", "sub-group / warp intrinsics", "hierarchical"]),
]


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: system and user text."""

    system: str
    user: str

    def messages(self) -> list[dict[str, str]]:
        """OpenAI-style messages (system first)."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]

    @property
    def text(self) -> str:
        return self.system + "\n\n" + self.user

    @property
    def stable_prefix(self) -> str:
        """The part of the user prompt that stays the same across requests of one run (problem, device,
        runtime, sections): first, so providers' prompt caches can reuse it ("" if there is none)."""
        cut = self.user.find("\n# Task: ")
        return self.user[: cut + 1] if cut > 0 else ""


def clip(text: Any, limit: int = 4000) -> str:
    """Keep the head and tail of a long text."""
    s = "" if text is None else str(text)
    if len(s) <= limit:
        return s
    half = limit // 2
    return f"{s[:half]}\n... [{len(s) - limit} characters cut] ...\n{s[-half:]}"


def _fmt_bytes(n: Any) -> str:
    if n is None:
        return "?"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return str(n)


def hardware_facts(device: DeviceProfile) -> list[tuple[str, str]]:
    """(label, value) pairs for every known property of the device."""
    facts: list[tuple[str, str]] = [("device", f"{device.name} ({device.device_type}, {device.backend})")]
    add = facts.append
    if device.vendor:
        add(("vendor", device.vendor))
    if device.compute_capability:
        add(("compute capability", device.compute_capability))
    if device.compute_units:
        add(("compute units (SMs / CUs)", str(device.compute_units)))
    if device.warp_size:
        add(("warp / wavefront size", str(device.warp_size)))
    if device.sub_group_sizes:
        add(("sub-group sizes", ", ".join(map(str, device.sub_group_sizes))))
    if device.max_work_group_size:
        add(("max work-group (block) size", str(device.max_work_group_size)))
    if device.max_work_item_sizes:
        add(("max work-item sizes per dimension", " x ".join(map(str, device.max_work_item_sizes))))
    if device.local_mem_bytes:
        add(("local / shared memory per work-group", _fmt_bytes(device.local_mem_bytes)))
    if device.shared_mem_per_block and device.shared_mem_per_block != device.local_mem_bytes:
        add(("shared memory per block", _fmt_bytes(device.shared_mem_per_block)))
    if device.shared_mem_per_sm:
        add(("shared memory per SM", _fmt_bytes(device.shared_mem_per_sm)))
    if device.registers_per_block:
        add(("32-bit registers per block", str(device.registers_per_block)))
    if device.registers_per_sm:
        add(("32-bit registers per SM", str(device.registers_per_sm)))
    if device.l2_cache_bytes:
        add(("L2 cache", _fmt_bytes(device.l2_cache_bytes)))
    if device.global_mem_bytes:
        add(("global memory", _fmt_bytes(device.global_mem_bytes)))
    if device.preferred_vector_width_float:
        add(("preferred float vector width", str(device.preferred_vector_width_float)))
    if device.peak_bandwidth_gbs:
        how = "measured" if device.peaks_measured else "nominal"
        add(("memory bandwidth", f"{device.peak_bandwidth_gbs:.0f} GB/s ({how})"))
    if device.peak_gflops:
        add(("fp32 peak", f"{device.peak_gflops:.0f} GFLOP/s"))
    return facts


def roofline_ms(request: GenerationRequest) -> dict[str, float]:
    """Lower bounds on the kernel time from bytes moved and FLOPs (where both sides are known)."""
    out: dict[str, float] = {}
    p, d = request.problem, request.device
    if p.bytes_moved and d.peak_bandwidth_gbs:
        out["memory"] = p.bytes_moved / (d.peak_bandwidth_gbs * 1e9) * 1e3
    if p.flops and d.peak_gflops:
        out["compute"] = p.flops / (d.peak_gflops * 1e9) * 1e3
    return out


def attempt_view(attempt: Attempt, source_limit: int = 12000, log_limit: int = 3000) -> dict[str, Any]:
    """Plain data about a previous attempt for the templates."""
    rec = attempt.record
    view: dict[str, Any] = {
        "source": clip(attempt.candidate.source, source_limit),
        "params": attempt.candidate.params,
        "cell": list(attempt.cell) if attempt.cell is not None else None,
        "outcome": rec.outcome.value if rec else "not evaluated",
        "message": clip(rec.message, 1500) if rec else "",
        "log": clip(rec.log, log_limit) if rec and rec.log else "",
        "resources": rec.resources if rec else {},
        "speedup": rec.speedup if rec else None,
        "time_ms": rec.timing.median_ms if rec and rec.timing else None,
        "spread": rec.timing.spread if rec and rec.timing else None,
        "ref_ms": rec.reference_timing.median_ms if rec and rec.reference_timing else None,
        "roofline_fraction": rec.roofline_fraction if rec else None,
    }
    return view


class PromptBuilder:
    """Renders requests with the packaged templates (or a directory of overrides)."""

    def __init__(self, template_dir: str | None = None) -> None:
        loaders: list[jinja2.BaseLoader] = []
        if template_dir:
            loaders.append(jinja2.FileSystemLoader(template_dir))
        loaders.append(jinja2.PackageLoader("kfoundry.core.llm", "templates"))
        self.env = jinja2.Environment(
            loader=jinja2.ChoiceLoader(loaders),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
            autoescape=False,
        )
        self.env.filters["clip"] = clip
        self.env.filters["bytes"] = _fmt_bytes

    def _render(self, name: str, **ctx: Any) -> str:
        text = self.env.get_template(name).render(**ctx)
        return "\n".join(line.rstrip() for line in text.strip().split("\n")) + "\n"

    def context(self, request: GenerationRequest) -> dict[str, Any]:
        sections = {**DEFAULT_SECTIONS, **request.prompt_sections}
        return {
            "req": request,
            "problem": request.problem,
            "language": request.language,
            "kind": request.problem.format,
            "hardware": hardware_facts(request.device),
            "device": request.device,
            "roofline": roofline_ms(request),
            "parent": attempt_view(request.parent) if request.parent else None,
            "inspirations": [attempt_view(a, source_limit=5000, log_limit=600) for a in request.inspirations],
            "target": list(request.target_cell) if request.target_cell is not None else None,
            "descriptors": axis_descriptions(request.extra.get("descriptors")) or DESCRIPTORS,
            "sections": [
                (SECTION_TITLES.get(k, k.replace("_", " ").capitalize()), v) for k, v in sections.items() if v
            ],
            "feedback": request.extra.get("reply_feedback", ""),
        }

    def generation(self, request: GenerationRequest) -> Prompt:
        """The prompt that asks for one kernel."""
        ctx = self.context(request)
        return Prompt(self._render("system.j2", **ctx), self._render_language(request.language, ctx))

    def _render_language(self, language: str, ctx: dict[str, Any]) -> str:
        """``<language>.j2`` (a template directory's or the bundled one), else the language plugin's template."""
        try:
            return self._render(f"{language}.j2", **ctx)
        except jinja2.TemplateNotFound:
            from kfoundry.core.languages import get_language

            text = get_language(language).prompt_template
            if not text:
                raise KfError(
                    f"no prompt for kernel language {language!r}: no {language}.j2 template and its "
                    "LanguageSpec has no prompt_template"
                ) from None
            rendered = self.env.from_string(text).render(**ctx)
            return "\n".join(line.rstrip() for line in rendered.strip().split("\n")) + "\n"

    def ranking(self, request: GenerationRequest, proposals: list[Proposal]) -> Prompt:
        """The prompt that asks a member to rank proposals against the rubric."""
        ctx = self.context(request)
        ctx["proposals"] = [clip(p.candidate.source if p.candidate else "", 6000) for p in proposals]
        return Prompt(self._render("system.j2", **ctx), self._render("rank.j2", **ctx))

    def meta(self, section: str, text: str, stats: dict[str, Any], language: str) -> Prompt:
        """The prompt that asks the meta-model to rewrite one evolvable section."""
        ctx = {
            "section": SECTION_TITLES.get(section, section),
            "text": text,
            "stats": stats,
            "language": language,
        }
        return Prompt(self._render("meta_system.j2", **ctx), self._render("meta.j2", **ctx))
