"""``kf-run llm-calls RUN_DIR``: what a run asked its language models, what they answered and what it cost."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from kfoundry.core.errors import KfError
from kfoundry.core.llm.recording import RECORDING_NAME, CallRecord, load_recording


def _summary(calls: list[CallRecord]) -> Table:
    table = Table(title="per member")
    for col in ("member", "calls", "failed", "tokens in", "tokens out", "cost (USD)"):
        table.add_column(col, justify="left" if col == "member" else "right")
    for member in sorted({c.member for c in calls}):
        mine = [c for c in calls if c.member == member and c.error_kind != "budget"]
        table.add_row(
            member,
            str(len(mine)),
            str(sum(1 for c in mine if c.error)),
            str(sum(c.tokens_in for c in mine)),
            str(sum(c.tokens_out for c in mine)),
            f"{sum(c.cost_usd for c in mine):.4f}",
        )
    return table


@click.command(
    "llm-calls",
    epilog="\b\nExamples:\n  kf-run llm-calls kf-runs/softmax-20261130-104500\n"
    "  kf-run llm-calls kf-runs/softmax-20261130-104500 --show 7",
)
@click.argument("run_dir", type=click.Path(exists=True))
@click.option(
    "--show", "show", type=int, default=None, metavar="SEQ", help="Print the prompt and reply of call SEQ."
)
def command(run_dir: str, show: int | None) -> None:
    """List RUN_DIR's language-model calls (from its llm_calls.jsonl): kind, tokens, cost, errors."""
    path = Path(run_dir)
    if path.is_dir() and not (path / RECORDING_NAME).is_file():
        raise KfError(f"{path}: no {RECORDING_NAME} (the run used no language model)")
    calls = load_recording(path)
    console = Console()
    if show is not None:
        found = [c for c in calls if c.seq == show]
        if not found:
            raise KfError(
                f"no call {show} (calls are numbered 1 to {max((c.seq for c in calls), default=0)})"
            )
        c = found[0]
        console.rule(f"call {c.seq}: {c.member} {c.kind}, generation {c.generation}")
        console.print(
            "[bold]system[/bold]",
            c.system,
            "[bold]prompt[/bold]",
            c.prompt,
            sep="\n",
            markup=True,
            highlight=False,
        )
        console.rule("reply" if c.error is None else f"error ({c.error_kind})")
        console.print(c.response if c.error is None else c.error, markup=False, highlight=False)
        return
    table = Table(title=f"{len(calls)} language-model calls")
    for col in ("seq", "gen", "member", "kind", "tokens in", "tokens out", "cost", "s", "tries", "error"):
        table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=24 if col == "error" else None)
    for c in calls:
        table.add_row(
            str(c.seq),
            str(c.generation if c.generation is not None else "-"),
            c.member,
            c.kind,
            str(c.tokens_in),
            str(c.tokens_out),
            f"{c.cost_usd:.4f}",
            f"{c.latency_s:.1f}",
            str(c.attempts),
            c.error_kind or "",
        )
    console.print(table)
    console.print(_summary(calls))
