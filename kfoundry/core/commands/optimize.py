"""``kf-run PROBLEM``: optimize a problem (the main job), with a progress bar and a live best line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kfoundry.core.config import RunConfig, load_config
from kfoundry.core.db.loop import Row
from kfoundry.core.errors import ConfigError
from kfoundry.core.loop import OptimizeLoop
from kfoundry.core.run.planning import seed_count

if TYPE_CHECKING:
    from kfoundry.api import OptimizeResult


class RichObserver:
    """A progress bar over the evaluation budget and a live line with the best speedup so far."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.fields[gen]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("", total=total, gen="gen 0")

    def _line(self, loop: OptimizeLoop) -> str:
        best = loop.strategy.best
        if best is None or not best.record.is_correct:
            return "no correct kernel yet"
        seed = loop.seed_record
        vs_seed = ""
        if seed and seed.timing and best.record.timing:
            vs_seed = f", {seed.timing.median_ms / best.record.timing.median_ms:.1f}x the seed"
        return (
            f"best {best.record.speedup or 0:.2f}x vs reference{vs_seed} ({best.candidate.label}) · "
            f"cells {len(loop.strategy.archive)}"
        )

    def started(self, loop: OptimizeLoop) -> None:
        self.progress.start()
        self.progress.update(
            self.task,
            completed=loop.evaluations,
            description=self._line(loop),
            gen=f"gen {loop.state.generation}",
        )

    def evaluated(self, loop: OptimizeLoop, row: Row) -> None:
        rec = row.record
        label = row.candidate.label if row.candidate else "?"
        verdict = rec.outcome.value if rec else "?"
        if rec and rec.is_correct and rec.speedup:
            verdict = f"{rec.speedup:.2f}x"
        self.progress.update(
            self.task,
            completed=loop.evaluations,
            gen=f"gen {row.generation}",
            description=f"{self._line(loop)} · last: {label} {verdict}",
        )

    def generation_done(self, loop: OptimizeLoop, generation: int) -> None:
        self.progress.update(self.task, description=self._line(loop), completed=loop.evaluations)

    def note(self, loop: OptimizeLoop, text: str) -> None:
        self.progress.console.print(f"[dim]{text}[/dim]")

    def stop(self) -> None:
        self.progress.stop()


def budget_total(config: RunConfig) -> int:
    """Evaluations the run plans: seeding, the generations' proposals and the tuning stages."""
    b, t = config.budget, config.tuner
    planned = seed_count(config) + (b.generations - 1) * b.proposals_per_generation
    stages = 0 if t.every < 0 else (1 if t.every == 0 else max(1, b.generations // t.every))
    planned += stages * t.elites * t.evaluations
    return min(planned, b.evaluations) if b.evaluations else planned


def print_summary(console: Console, result: OptimizeResult) -> None:
    """The archive table, the per-shape table of a multi-shape run, then the best kernel."""
    table = Table(title=f"archive ({len(result.archive)} elites, coverage {result.coverage:.0%} of cells)")
    for col in ("island", "cell (mem,cmp,par)", "kernel", "params", "outcome", "speedup", "ms"):
        table.add_column(col)
    for cell in result.archive:
        rec = cell.record
        table.add_row(
            str(cell.island),
            str(tuple(cell.coords)),
            cell.candidate.label + (" (migrant)" if cell.migrated else ""),
            ", ".join(f"{k}={v}" for k, v in cell.candidate.params.items()),
            rec.outcome.value,
            f"{rec.speedup:.2f}x" if rec.speedup else "-",
            f"{rec.timing.median_ms:.3f}" if rec.timing else "-",
        )
    console.print(table)
    if len(result.best_per_shape) > 1:
        shapes = Table(title="best kernel per shape set")
        for col in ("shapes", "outcome", "speedup", "ms", "reference ms"):
            shapes.add_column(col)
        for s in result.best_per_shape:
            shapes.add_row(
                ", ".join(f"{k}={v}" for k, v in s.shapes.items()),
                s.outcome,
                f"{s.speedup:.2f}x" if s.speedup else "-",
                f"{s.median_ms:.4f}" if s.median_ms else "-",
                f"{s.reference_ms:.4f}" if s.reference_ms else "-",
            )
        console.print(shapes)
    best = result.best
    console.print(
        f"stopped: {result.stop_reason} · {result.generations} generations, {result.evaluations} evaluations"
    )
    if result.llm_usage:
        u = result.llm_usage
        failed = ""
        if u.get("failed"):
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(u.get("failures", {}).items()))
            failed = f", {u['failed']} failed ({kinds})"
        console.print(
            f"LLM: {u['calls']} calls{failed}, {u['tokens_in'] + u['tokens_out']} tokens, ${u['cost_usd']:.4f}"
        )
    if best is None or not best.record.is_correct:
        console.print("[red]no correct kernel found[/red]")
        return
    rec = best.record
    seed = f", {result.speedup_over_seed:.1f}x faster than the naive seed" if result.speedup_over_seed else ""
    spread = f" (IQR {rec.timing.iqr_ms:.3f} ms, n={rec.timing.n})" if rec.timing else ""
    geo = " (geo-mean over shape sets)" if len(result.shape_sets) > 1 else ""
    console.print(
        f"[bold green]best kernel:[/bold green] {best.candidate.label} {best.candidate.params} · "
        f"{rec.timing.median_ms if rec.timing else float('nan'):.3f} ms{spread} · "
        f"{rec.speedup:.2f}x vs the reference{geo}{seed}"
        + (" [yellow](flagged for review)[/yellow]" if rec.roofline_flag else "")
    )
    if result.exported:
        console.print(f"exported: {result.exported}")
    if result.report:
        console.print(f"report: {result.report}")
    console.print(f"run folder: {result.run_dir}   (resume: kf-run resume {result.run_dir})")


def cli_observer(config: RunConfig) -> RichObserver | None:
    """A progress bar on a terminal (stderr); None without one (the log lines say it all)."""
    ctx = click.get_current_context(silent=True)
    terminal = bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("terminal"))
    if not terminal:
        return None
    from kfoundry.core import cli

    return RichObserver(cli.terminal_console or Console(stderr=True), budget_total(config))


def finish(result: OptimizeResult, as_json: bool, console: Console | None = None) -> None:
    """Print a run's result: JSON on stdout, or the summary for people."""
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        print_summary(console or Console(), result)


def run_loop(
    config: RunConfig,
    problem_path: Path,
    shapes: dict[str, Any] | list[dict[str, Any]],
    run_id: str,
    run_dir: Path,
    seed_kernel: Path | None,
    console: Console,
    observer: RichObserver | None = None,
) -> OptimizeResult:
    """Run a run folder's loop to the end (a shape set, or a list of them) and print its summary."""
    from kfoundry.api import run_folder

    sets = shapes if isinstance(shapes, list) else [shapes]
    try:
        result = run_folder(config, problem_path, sets, run_id, run_dir, seed_kernel, observer)
    finally:
        if observer is not None:
            observer.stop()
    print_summary(console, result)
    return result


@click.command(
    "optimize",
    epilog="""\b
Examples:
  kf-run examples/kernelbench/matmul.py
  kf-run examples/kernelbench/softmax.py --set search.name=ga --set budget.generations=4
  kf-run examples/kernelbench/matmul.py --shape M=512 --set budget.wall_time_s=300
  kf-run examples/kernelbench/softmax.py --shape batch_size=16,64 --shape dim=256,4096   (4 shape sets)
  kf-run examples/kernelbench/softmax.py --json | jq .best.speedup
""",
)
@click.argument("problem", required=False)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML run config.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a config value.")
@click.option(
    "--shape",
    "shape_items",
    multiple=True,
    metavar="NAME=V1[,V2..]",
    help="Override a shape constant; several values (or the option repeated) make shape sets.",
)
@click.option(
    "--seed-kernel", type=click.Path(dir_okay=False, exists=True), help="Naive seed kernel to start from."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the result as JSON on stdout (progress stays on stderr)."
)
def command(
    problem: str | None,
    config_path: str | None,
    overrides: tuple[str, ...],
    shape_items: tuple[str, ...],
    seed_kernel: str | None,
    as_json: bool,
) -> None:
    """Optimize PROBLEM (a KernelBench .py file or a native task .toml): search, evaluate, tune, export."""
    from kfoundry.api import optimize

    config = load_config(config_path, overrides)
    path_text = problem or config.problem.path
    if not path_text:
        raise ConfigError("no problem given: kf-run PROBLEM (or problem.path in the config)")
    shape_sets = parse_shape_sets(shape_items)
    observer = cli_observer(config)
    try:
        result = optimize(
            path_text,
            config=config,
            shapes=shape_sets[0] if len(shape_sets) == 1 else None,
            shape_sets=shape_sets if len(shape_sets) > 1 else None,
            seed_kernel=seed_kernel,
            observer=observer,
        )
    finally:
        if observer is not None:
            observer.stop()
    finish(result, as_json)


def parse_shape_sets(items: tuple[str, ...] | list[str]) -> list[dict[str, int | float]]:
    """``--shape`` values as shape sets: ``dim=256,4096`` (or ``--shape dim=256 --shape dim=4096``) gives
    one set per value; several names combine as a product (``[]``: no ``--shape`` given)."""
    import itertools

    from kfoundry.core.problem import parse_shape_overrides

    values: dict[str, list[int | float]] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip() or not raw.strip():
            raise ConfigError(f"--shape {item!r}: expected NAME=VALUE[,VALUE...]")
        for part in raw.split(","):
            value = parse_shape_overrides([f"{name.strip()}={part.strip()}"])[name.strip()]
            bucket = values.setdefault(name.strip(), [])
            if value not in bucket:
                bucket.append(value)
    names = list(values)
    if not names:
        return []
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(values[n] for n in names))]
