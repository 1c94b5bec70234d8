"""``report.html``: one self-contained page about a run that opens offline.

Charts are plotly figures; the plotly.js bundle is inlined once (``include_plotlyjs=True``), so the
file needs no network. Sections: best speedup over evaluations (per strategy and per generator),
archive heatmaps per descriptor pair, the best kernel's lineage, a roofline chart of every correct
kernel, outcomes per generation, tuner convergence, tokens and cost, the per-shape table and the
best kernels' source with a diff against the seed.
"""

from __future__ import annotations

import difflib
import html
import itertools
import logging
import math
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kfoundry.core.behaviour.axes import axes_of_config
from kfoundry.core.descriptors import LEVELS
from kfoundry.core.report.data import REPORT_FILE, RunData, best_per_shape, load_run, per_shape_results

log = logging.getLogger(__name__)

#: Outcome colours, failure stages in warm colours.
_COLOURS = {
    "correct": "#2ca02c",
    "incorrect": "#d62728",
    "compile_error": "#ff7f0e",
    "runtime_error": "#e377c2",
    "timeout": "#8c564b",
    "rejected": "#9467bd",
    "parse_error": "#7f7f7f",
}


class _Page:
    """Collects sections; the first figure carries the inlined plotly.js bundle."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.figures = 0

    def heading(self, title: str, anchor: str) -> None:
        self.parts.append(f'<h2 id="{anchor}">{html.escape(title)}</h2>')

    def note(self, text: str) -> None:
        self.parts.append(f'<p class="note">{html.escape(text)}</p>')

    def raw(self, text: str) -> None:
        self.parts.append(text)

    def figure(self, fig: Any, name: str) -> None:
        fig.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 50, "b": 50}, height=420)
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=self.figures == 0,
            div_id=f"chart-{name}",
            config={"displaylogo": False, "responsive": True},
        )
        self.parts.append(f'<div class="kf-chart" data-chart="{name}">{div}</div>')
        self.figures += 1

    def table(self, header: list[str], rows: list[list[Any]], cls: str = "") -> None:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows
        )
        self.parts.append(f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "(defaults)"
    return str(value)


def _go() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError as exc:  # pragma: no cover - the report extra installs plotly
        raise ImportError("the report needs plotly: pip install 'kfoundry[report]'") from exc
    return go


# -- sections ----------------------------------------------------------------------------------------


def _progress(page: _Page, run: RunData) -> None:
    go = _go()
    page.heading("Best speedup over evaluations", "progress")
    if not run.evaluations:
        page.note("no evaluation finished yet")
        return
    strategy = str(run.config.get("search", {}).get("name", "search"))
    fig = go.Figure()
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    best_all = 0.0
    best_by: dict[str, float] = defaultdict(float)
    for e in run.evaluations:
        speed = e.record.speedup if e.record.is_correct and e.record.speedup else 0.0
        best_all = max(best_all, speed)
        series[f"{strategy} (all generators)"].append((e.order + 1, best_all))
        best_by[e.generator] = max(best_by[e.generator], speed)
        series[e.generator].append((e.order + 1, best_by[e.generator]))
    for name, points in series.items():
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                mode="lines+markers",
                name=name,
                line={"shape": "hv", "width": 3 if "all generators" in name else 1.5},
            )
        )
    fig.update_layout(
        title=f"best correct speedup over the reference so far ({strategy})",
        xaxis_title="evaluation",
        yaxis_title="speedup (x)",
    )
    page.figure(fig, "progress")


def _heatmaps(page: _Page, run: RunData) -> None:
    go = _go()
    page.heading("Archive: best speedup per descriptor pair", "archive")
    if not run.archive:
        page.note("the archive is empty (no generation finished)")
        return
    dims = max(len(c["coords"]) for c in run.archive)
    axes = axes_of_config(run.config)  # the run's own descriptor choice
    levels = [a.levels for a in axes] if len(axes) == dims else [LEVELS] * dims
    sizes = [
        max([c["coords"][i] + 1 for c in run.archive if len(c["coords"]) > i] + [levels[i]])
        for i in range(dims)
    ]
    names = [a.name for a in axes] if len(axes) == dims else [f"axis {i}" for i in range(dims)]
    for a, b in itertools.combinations(range(dims), 2):
        grid = [[math.nan] * sizes[b] for _ in range(sizes[a])]
        for cell in run.archive:
            coords = cell["coords"]
            if max(a, b) >= len(coords):
                continue
            value = cell["speedup"] if cell["outcome"] == "correct" and cell["speedup"] else 0.0
            y, x = coords[a], coords[b]
            if math.isnan(grid[y][x]) or value > grid[y][x]:
                grid[y][x] = value
        z = [[None if math.isnan(v) else v for v in row] for row in grid]
        fig = go.Figure(
            go.Heatmap(
                z=z,
                x=list(range(sizes[b])),
                y=list(range(sizes[a])),
                colorscale="Viridis",
                colorbar={"title": "speedup"},
                hoverongaps=False,
            )
        )
        fig.update_layout(
            title=f"{names[a]} x {names[b]} (empty: no elite)",
            xaxis_title=names[b],
            yaxis_title=names[a],
            xaxis={"dtick": 1},
            yaxis={"dtick": 1},
        )
        page.figure(fig, f"archive-{a}-{b}")


def _lineage(page: _Page, run: RunData) -> None:
    go = _go()
    page.heading("The best kernel's lineage", "lineage")
    if run.best is None:
        page.note("no correct kernel: no lineage")
        return
    chain = run.lineage(run.best[0])
    xs, ys, texts, rows = [], [], [], []
    for i, cand in enumerate(chain):
        rec = run.best_record_of(cand.content_hash)
        speed = rec.speedup if rec is not None and rec.is_correct else None
        xs.append(i)
        ys.append(speed or 0.0)
        texts.append(cand.label or cand.content_hash[:10])
        rows.append(
            [
                i,
                cand.content_hash[:12],
                cand.label,
                cand.generator,
                cand.params,
                rec.outcome.value if rec else "-",
                speed,
            ]
        )
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines+markers+text", text=texts, textposition="top center"))
    fig.update_layout(
        title="ancestors of the best kernel, oldest first",
        xaxis_title="step",
        yaxis_title="speedup (x; 0: not correct)",
    )
    page.figure(fig, "lineage")
    page.table(["step", "id", "kernel", "generator", "params", "outcome", "speedup"], rows)


def _analyses(run: RunData) -> list[tuple[float, float] | None]:
    """(bytes moved, FLOPs) of one call per shape set, from the problem's reference (None if unknown)."""
    out: list[tuple[float, float] | None] = []
    for shapes in run.shape_sets:
        try:
            from kfoundry.core.problem import load_problem

            a = load_problem(run.problem_path, shapes).analysis()
            out.append((float(a.bytes_moved), float(a.flops)))
        except Exception as exc:  # the problem file may have moved; the rest of the report stands
            log.warning("roofline: cannot analyse %s %s: %s", run.problem_path, shapes, exc)
            out.append(None)
    return out


def _roofline(page: _Page, run: RunData) -> None:
    go = _go()
    page.heading("Roofline of every correct kernel", "roofline")
    kernels = run.correct()
    analyses = _analyses(run) if kernels else []
    if not kernels or not any(analyses):
        page.note("no correct kernel, or the problem could not be analysed: no roofline")
        return
    use_flops = all(a is not None and a[1] > 0 for a in analyses if a)
    fig = go.Figure()
    ceilings: list[tuple[float, float]] = []
    for i, analysis in enumerate(analyses):
        if analysis is None:
            continue
        nbytes, flops = analysis
        intensity = flops / nbytes if nbytes else 0.0
        xs, ys, texts = [], [], []
        for cand, rec in kernels:
            rows = per_shape_results(rec, run.shape_sets)
            if i >= len(rows) or not rows[i].get("median_ms"):
                continue
            seconds = rows[i]["median_ms"] / 1e3
            achieved = (flops / seconds / 1e9) if use_flops else (nbytes / seconds / 1e9)
            xs.append(intensity if use_flops else (rows[i].get("speedup") or 0.0))
            ys.append(achieved)
            texts.append(f"{cand.label} {cand.params}")
            if rec.roofline_fraction and i == 0:
                ceilings.append((xs[-1], achieved / rec.roofline_fraction))
        shapes = _fmt(run.shape_sets[i])
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name=f"kernels on {shapes}",
                text=texts,
                marker={"size": 9, "opacity": 0.8},
            )
        )
    if ceilings:
        x, y = max(ceilings, key=lambda c: c[1])
        fig.add_trace(
            go.Scatter(
                x=[x],
                y=[y],
                mode="markers",
                name="attainable (device roofline)",
                marker={"symbol": "line-ew-open", "size": 30, "line": {"width": 3}},
            )
        )
    if use_flops:
        fig.update_layout(
            title="achieved GFLOP/s against arithmetic intensity",
            xaxis_type="log",
            yaxis_type="log",
            xaxis_title="FLOP per byte moved",
            yaxis_title="GFLOP/s",
        )
    else:
        fig.update_layout(
            title="achieved memory bandwidth (the reference does no counted FLOPs)",
            xaxis_title="speedup over the reference (x)",
            yaxis_title="GB/s moved",
        )
    page.figure(fig, "roofline")


def _outcomes(page: _Page, run: RunData) -> None:
    go = _go()
    page.heading("Outcomes per generation", "outcomes")
    if not run.evaluations:
        page.note("no evaluation finished yet")
        return
    counts: dict[str, Counter[int]] = defaultdict(Counter)
    gens = sorted({e.generation for e in run.evaluations})
    for e in run.evaluations:
        counts[e.record.outcome.value][e.generation] += 1
    fig = go.Figure()
    for outcome, by_gen in sorted(counts.items()):
        fig.add_trace(
            go.Bar(
                x=gens, y=[by_gen.get(g, 0) for g in gens], name=outcome, marker_color=_COLOURS.get(outcome)
            )
        )
    fig.update_layout(
        barmode="stack",
        title="verdicts of each generation's proposals",
        xaxis_title="generation",
        yaxis_title="proposals",
        xaxis={"dtick": 1},
    )
    page.figure(fig, "outcomes")


def _tuning(page: _Page, run: RunData) -> None:
    go = _go()
    page.heading("Tuner convergence", "tuning")
    stages = [s for s in run.tuning if s.trials]
    if not stages:
        page.note("no tuning stage ran (tuner.every < 0, or no elite had tunable parameters)")
        return
    fig = go.Figure()
    for s in stages:
        best, xs, ys = math.inf, [], []
        for i, t in s.trials:
            if t is not None:
                best = min(best, t)
            xs.append(i + 1)
            ys.append(None if math.isinf(best) else best)
        label = (
            run.candidates[s.candidate_hash].label
            if s.candidate_hash in run.candidates
            else s.candidate_hash[:8]
        )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                line={"shape": "hv"},
                name=f"gen {s.generation}: {label} ({s.result.tuner}){' on ' + _fmt(s.shapes) if s.shapes else ''}",
            )
        )
    fig.update_layout(title="best time found so far per tuning stage", xaxis_title="trial", yaxis_title="ms")
    page.figure(fig, "tuning")
    page.table(
        ["generation", "kernel", "shapes", "tuner", "trials", "invalid", "best params", "best ms"],
        [
            [
                s.generation,
                run.candidates[s.candidate_hash].label if s.candidate_hash in run.candidates else "?",
                s.shapes or "all shape sets",
                s.result.tuner,
                s.result.evaluations,
                s.result.invalid,
                s.result.best_params,
                s.result.best_time_ms,
            ]
            for s in run.tuning
        ],
    )


def _llm(page: _Page, run: RunData) -> None:
    go = _go()
    page.heading("Tokens and cost", "llm")
    if not run.llm_calls:
        gens = sorted({e.generator for e in run.evaluations})
        page.note(f"no language-model calls: generators {', '.join(gens) or '-'} cost nothing")
        return
    members: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for c in run.llm_calls:
        m = members[c["member"]]
        m["calls"] += 1
        m["tokens_in"] += c["tokens_in"] or 0
        m["tokens_out"] += c["tokens_out"] or 0
        m["cost_usd"] += c["cost_usd"] or 0.0
        m["errors"] += 1 if c["error_kind"] else 0
    names = sorted(members)
    fig = go.Figure(
        [
            go.Bar(x=names, y=[members[n]["tokens_in"] for n in names], name="tokens in"),
            go.Bar(x=names, y=[members[n]["tokens_out"] for n in names], name="tokens out"),
        ]
    )
    fig.update_layout(barmode="stack", title="tokens per model", yaxis_title="tokens")
    page.figure(fig, "llm")
    keys = ("calls", "tokens_in", "tokens_out", "cost_usd", "errors")
    total = {k: sum(members[n][k] for n in names) for k in keys}
    rows: list[list[Any]] = [
        [n, *(round(members[n][k], 6) if k == "cost_usd" else int(members[n][k]) for k in keys)]
        for n in names
    ]
    rows.append(["total", *(round(total[k], 6) if k == "cost_usd" else int(total[k]) for k in keys)])
    page.table(["model", "calls", "tokens in", "tokens out", "cost (USD)", "failed"], rows)


def _shapes(page: _Page, run: RunData) -> None:
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


def _sources(page: _Page, run: RunData, top: int = 3) -> None:
    page.heading("The best kernels' source", "source")
    kernels = run.correct()[:top]
    if not kernels:
        page.note("no correct kernel")
        return
    seed = run.seed.candidate if run.seed is not None else None
    for rank, (cand, rec) in enumerate(kernels, 1):
        title = (
            f"#{rank} {cand.label} {_fmt(cand.params)} · {rec.speedup or 0:.3f}x · id {cand.content_hash[:12]}"
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
    page = _Page()
    for section in (_progress, _heatmaps, _lineage, _roofline, _outcomes, _tuning, _llm, _shapes, _sources):
        section(page, run)
    best = run.best
    headline = "no correct kernel found"
    if best is not None:
        headline = (
            f"best: {best[0].label} {_fmt(best[0].params)} · {best[1].speedup or 0:.3f}x over the reference"
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
        ["shape sets", "; ".join(_fmt(s) for s in run.shape_sets)],
    ]
    fact_rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in facts
    )
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
