"""``kf-run show RUN_DIR [--candidate ID]``: a run's best kernel, or one candidate: source, verdicts, timings."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from kfoundry.core.models import Candidate, EvalRecord


def _record(rec: EvalRecord) -> dict[str, Any]:
    t, r = rec.timing, rec.reference_timing
    return {
        "outcome": rec.outcome.value,
        "message": rec.message,
        "speedup": rec.speedup,
        "device": rec.device,
        "median_ms": t.median_ms if t else None,
        "iqr_ms": t.iqr_ms if t else None,
        "n": t.n if t else None,
        "reference_ms": r.median_ms if r else None,
        "roofline_fraction": rec.roofline_fraction,
        "roofline_flag": rec.roofline_flag,
        "eval_key": rec.eval_key,
        "created_at": rec.created_at.isoformat(),
        "per_shape": rec.resources.get("per_shape"),
    }


def describe(run_dir: Path, candidate_id: str | None) -> dict[str, Any]:
    """What ``show`` prints, as plain data."""
    from kfoundry.core.report.data import RunFolderError, load_run

    run = load_run(run_dir)
    if candidate_id:
        cand: Candidate = run.find_candidate(candidate_id)
    elif run.best is not None:
        cand = run.best[0]
    else:
        raise RunFolderError(
            f"{run_dir}: no correct kernel yet; pick one with --candidate ID (kf-run show --json)"
        )
    verdicts = [_record(r) for r in run.records.get(cand.content_hash, [])]
    loop = run.best_record_of(cand.content_hash)
    return {
        "run_id": run.run_id,
        "problem": run.problem,
        "status": run.status,
        "candidate": {
            "id": cand.content_hash,
            "label": cand.label,
            "language": cand.language,
            "kind": cand.kind,
            "params": cand.params,
            "generator": cand.generator,
            "parent_id": cand.parent_id,
            "source": cand.source,
        },
        "verdict": _record(loop) if loop is not None else None,
        "evaluations": verdicts,
        "lineage": [c.content_hash for c in run.lineage(cand)],
        "top": [
            {
                "id": c.content_hash,
                "label": c.label,
                "params": c.params,
                "speedup": r.speedup,
                "median_ms": r.timing.median_ms if r.timing else None,
            }
            for c, r in run.correct()[:10]
        ],
    }


@click.command(
    "show",
    epilog="\b\nExamples:\n  kf-run show kf-runs/softmax-20261201-101500\n"
    "  kf-run show kf-runs/softmax-20261201-101500 --candidate 3fa2c1 --json",
)
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--candidate", "candidate_id", metavar="ID", help="A candidate id (a unique prefix is enough).")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
def command(run_dir: str, candidate_id: str | None, as_json: bool) -> None:
    """Show RUN_DIR's best kernel (or candidate ID): source, verdicts and timings, and the run's top kernels."""
    data = describe(Path(run_dir), candidate_id)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    console = Console(width=None if sys.stdout.isatty() else 160)
    c, v = data["candidate"], data["verdict"]
    console.print(
        f"[bold]{c['label'] or c['id'][:12]}[/bold] {c['params']} · id {c['id'][:16]} · {c['generator']}"
        f" · run {data['run_id']} ({data['status']})"
    )
    if v is not None:
        speed = f"{v['speedup']:.3f}x" if v["speedup"] else "-"
        ms = f"{v['median_ms']:.4f} ms" if v["median_ms"] else "-"
        console.print(f"verdict: {v['outcome']} · {speed} over the reference · {ms} · {v['message']}")
    if data["evaluations"]:
        table = Table(title="evaluations (per shape set in a multi-shape run)")
        for col in ("outcome", "speedup", "median ms", "IQR ms", "n", "reference ms", "when"):
            table.add_column(col)
        for e in data["evaluations"]:
            table.add_row(
                e["outcome"],
                f"{e['speedup']:.3f}x" if e["speedup"] else "-",
                f"{e['median_ms']:.4f}" if e["median_ms"] else "-",
                f"{e['iqr_ms']:.4f}" if e["iqr_ms"] else "-",
                str(e["n"] or "-"),
                f"{e['reference_ms']:.4f}" if e["reference_ms"] else "-",
                e["created_at"][:19],
            )
        console.print(table)
    lexer = "python" if c["kind"] == "kernelbench" else "c"
    console.print(Syntax(c["source"], lexer, line_numbers=True, word_wrap=True))
    if data["top"]:
        top = Table(title="fastest correct kernels of the run")
        for col in ("id", "kernel", "params", "speedup", "ms"):
            top.add_column(col)
        for t in data["top"]:
            top.add_row(
                t["id"][:12],
                t["label"],
                str(t["params"]),
                f"{t['speedup'] or 0:.3f}x",
                f"{t['median_ms']:.4f}" if t["median_ms"] else "-",
            )
        console.print(top)
