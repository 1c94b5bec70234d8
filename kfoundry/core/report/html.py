"""``report.html``: one self-contained page about a run that opens offline.

Charts are plotly figures; the plotly.js bundle is inlined once (``include_plotlyjs=True``), so the
file needs no network. Sections: best speedup over evaluations (per strategy and per generator),
archive heatmaps per descriptor pair, the best kernel's lineage, a roofline chart of every correct
kernel, outcomes per generation, tuner convergence, tokens and cost, the per-shape table and the
best kernels' source with a diff against the seed.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path

from kfoundry.core.report.charts import (
    heatmaps_section,
    lineage_section,
    llm_section,
    outcomes_section,
    progress_section,
    roofline_section,
    tuning_section,
)
from kfoundry.core.report.data import REPORT_FILE, RunData, load_run
from kfoundry.core.report.page import Page, fmt
from kfoundry.core.report.tables import shapes_section, sources_section

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; } th { background: #f4f4f4; }
pre { background: #f8f8f8; padding: 0.8em; overflow-x: auto; font-size: 0.85em; border: 1px solid #eee; }
.diff .add { color: #116611; } .diff .del { color: #aa1111; } .diff .ctx { color: #555; }
.note { color: #666; font-style: italic; } nav a { margin-right: 1em; }
"""


def render_report(run: RunData) -> str:
    """The report page of a run, as one HTML string."""
    page = Page()
    for section in (
        progress_section,
        heatmaps_section,
        lineage_section,
        roofline_section,
        outcomes_section,
        tuning_section,
        llm_section,
        shapes_section,
        sources_section,
    ):
        section(page, run)
    best = run.best
    headline = "no correct kernel found"
    if best is not None:
        headline = (
            f"best: {best[0].label} {fmt(best[0].params)} · {best[1].speedup or 0:.3f}x over the reference"
            f" · {best[1].timing.median_ms if best[1].timing else float('nan'):.4f} ms on {best[1].device}"
        )
    facts = [
        ["run", run.run_id],
        ["problem", f"{run.problem} ({run.problem_path})"],
        ["status", run.status],
        ["stopped", run.summary.get("stop_reason", "-")],
        ["started", run.created_at],
        ["evaluations", len(run.evaluations)],
        ["generations", run.summary.get("generations", "-")],
        ["backend", run.config.get("backend", {}).get("name", "-")],
        ["search", run.config.get("search", {}).get("name", "-")],
        ["shape sets", "; ".join(fmt(s) for s in run.shape_sets)],
    ]
    fact_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(fmt(v))}</td></tr>" for k, v in facts)
    nav = " ".join(
        f'<a href="#{a}">{t}</a>'
        for a, t in (
            ("progress", "progress"),
            ("archive", "archive"),
            ("lineage", "lineage"),
            ("roofline", "roofline"),
            ("outcomes", "outcomes"),
            ("tuning", "tuning"),
            ("llm", "tokens"),
            ("shapes", "shapes"),
            ("source", "source"),
        )
    )
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>kfoundry report: {html.escape(run.problem)} ({html.escape(run.run_id)})</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>kfoundry: {html.escape(run.problem)}</h1><p><b>{html.escape(headline)}</b></p>"
        f'<table class="facts">{fact_rows}</table><nav>{nav}</nav>'
        + "\n".join(page.parts)
        + f'<p class="note">written {stamp} by kfoundry; {page.figures} charts; opens offline.</p></body></html>\n'
    )


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a run folder's report (default ``RUN_DIR/report.html``); returns its path."""
    run = load_run(run_dir)
    path = Path(out) if out is not None else run.run_dir / REPORT_FILE
    path.write_text(render_report(run), encoding="utf-8")
    return path
