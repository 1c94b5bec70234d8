"""The report's tables and sources: the per-shape results and the best kernels' source with a diff
against the seed."""

from __future__ import annotations

import difflib
import html

from kfoundry.core.report.data import RunData, best_per_shape, per_shape_results
from kfoundry.core.report.page import Page, fmt


def shapes_section(page: Page, run: RunData) -> None:
    page.heading("Per-shape results", "shapes")
    if run.best is None:
        page.note("no correct kernel")
        return
    page.raw("<h3>the best kernel on every shape set</h3>")
    page.table(
        ["shapes", "outcome", "speedup", "ms", "reference ms"],
        [
            [r.get("shapes"), r.get("outcome"), r.get("speedup"), r.get("median_ms"), r.get("reference_ms")]
            for r in per_shape_results(run.best[1], run.shape_sets)
        ],
        cls="per-shape",
    )
    page.raw("<h3>the fastest kernel per shape set (the export's dispatch table)</h3>")
    page.table(
        ["shapes", "kernel", "id", "params", "speedup", "ms"],
        [
            [
                b.shapes,
                b.candidate.label,
                b.candidate.content_hash[:12],
                b.candidate.params,
                b.speedup,
                b.median_ms,
            ]
            for b in best_per_shape(run)
        ],
        cls="per-shape-best",
    )


def sources_section(page: Page, run: RunData, top: int = 3) -> None:
    page.heading("The best kernels' source", "source")
    kernels = run.correct()[:top]
    if not kernels:
        page.note("no correct kernel")
        return
    seed = run.seed.candidate if run.seed is not None else None
    for rank, (cand, rec) in enumerate(kernels, 1):
        title = (
            f"#{rank} {cand.label} {fmt(cand.params)} · {rec.speedup or 0:.3f}x · id {cand.content_hash[:12]}"
            f" · {cand.generator}"
        )
        page.raw(f"<h3>{html.escape(title)}</h3>")
        page.raw(f'<pre class="source" data-rank="{rank}">{html.escape(cand.source)}</pre>')
        if seed is not None and seed.content_hash != cand.content_hash:
            diff = "".join(
                difflib.unified_diff(
                    seed.source.splitlines(True), cand.source.splitlines(True), "seed", cand.label or "kernel"
                )
            )
            page.raw(
                f"<details><summary>diff against the seed ({html.escape(seed.label)})</summary>"
                f'<pre class="diff">{_diff_html(diff)}</pre></details>'
            )
        elif seed is None:
            page.note("this run had no seed kernel: no diff")


def _diff_html(diff: str) -> str:
    out = []
    for line in diff.splitlines():
        cls = "add" if line.startswith("+") else "del" if line.startswith("-") else "ctx"
        out.append(f'<span class="{cls}">{html.escape(line)}</span>')
    return "\n".join(out)
