"""The report page's parts: sections collected in order, plotly figures (the bundle inlined once),
tables and the value formatting every section shares."""

from __future__ import annotations

import html
from typing import Any

#: Outcome colours, failure stages in warm colours.
COLOURS = {
    "correct": "#2ca02c",
    "incorrect": "#d62728",
    "compile_error": "#ff7f0e",
    "runtime_error": "#e377c2",
    "timeout": "#8c564b",
    "rejected": "#9467bd",
    "parse_error": "#7f7f7f",
}


class Page:
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
            "<tr>" + "".join(f"<td>{html.escape(fmt(c))}</td>" for c in row) + "</tr>" for row in rows
        )
        self.parts.append(f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "(defaults)"
    return str(value)


def plotly_go() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError as exc:  # pragma: no cover - the report extra installs plotly
        raise ImportError("the report needs plotly: pip install 'kfoundry[report]'") from exc
    return go
