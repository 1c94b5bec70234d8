"""The report's charts: progress per strategy and generator, archive heatmaps, lineage, roofline,
outcomes per generation, tuner convergence, tokens and cost (plotly figures on the page)."""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter, defaultdict
from typing import Any

from kfoundry.core.behaviour.axes import axes_of_config
from kfoundry.core.descriptors import LEVELS
from kfoundry.core.report.data import RunData, per_shape_results
from kfoundry.core.report.page import COLOURS, Page, fmt, plotly_go

log = logging.getLogger(__name__)


def progress_section(page: Page, run: RunData) -> None:
    go = plotly_go()
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


def heatmaps_section(page: Page, run: RunData) -> None:
    go = plotly_go()
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


def lineage_section(page: Page, run: RunData) -> None:
    go = plotly_go()
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


def roofline_section(page: Page, run: RunData) -> None:
    go = plotly_go()
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
        shapes = fmt(run.shape_sets[i])
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


def outcomes_section(page: Page, run: RunData) -> None:
    go = plotly_go()
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
                x=gens, y=[by_gen.get(g, 0) for g in gens], name=outcome, marker_color=COLOURS.get(outcome)
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


def tuning_section(page: Page, run: RunData) -> None:
    go = plotly_go()
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
                name=f"gen {s.generation}: {label} ({s.result.tuner}){' on ' + fmt(s.shapes) if s.shapes else ''}",
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


def llm_section(page: Page, run: RunData) -> None:
    go = plotly_go()
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
