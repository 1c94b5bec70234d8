"""``kf-run PROBLEM``: optimize a problem (the main job), with a progress bar and a live best line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kfoundry.core.config import RunConfig, load_config
from kfoundry.core.errors import ConfigError, KfError
from kfoundry.core.loop import (
    STORE_FILE,
    LoopSummary,
    OptimizeLoop,
    Row,
    find_seed_kernel,
    new_run_dir,
    write_run_file,
)
from kfoundry.core.store import Store


class RichObserver:
    """A progress bar over the evaluation budget and a live line with the best speedup so far."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.fields[gen]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=console, transient=False,
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
        return (f"best {best.record.speedup or 0:.2f}x vs reference{vs_seed} ({best.candidate.label}) · "
                f"cells {len(loop.strategy.archive)}")

    def started(self, loop: OptimizeLoop) -> None:
        self.progress.start()
        self.progress.update(self.task, completed=loop.evaluations, description=self._line(loop),
                             gen=f"gen {loop.state.generation}")

    def evaluated(self, loop: OptimizeLoop, row: Row) -> None:
        rec = row.record
        label = row.candidate.label if row.candidate else "?"
        verdict = rec.outcome.value if rec else "?"
        if rec and rec.is_correct and rec.speedup:
            verdict = f"{rec.speedup:.2f}x"
        self.progress.update(self.task, completed=loop.evaluations, gen=f"gen {row.generation}",
                             description=f"{self._line(loop)} · last: {label} {verdict}")

    def generation_done(self, loop: OptimizeLoop, generation: int) -> None:
        self.progress.update(self.task, description=self._line(loop), completed=loop.evaluations)

    def note(self, loop: OptimizeLoop, text: str) -> None:
        self.progress.console.print(f"[dim]{text}[/dim]")

    def stop(self) -> None:
        self.progress.stop()


def budget_total(config: RunConfig) -> int:
    """Evaluations the run plans: seeding, the generations' proposals and the tuning stages."""
    b, t = config.budget, config.tuner
    planned = max(b.proposals_per_generation, 8) + (b.generations - 1) * b.proposals_per_generation
    stages = 0 if t.every < 0 else (1 if t.every == 0 else max(1, b.generations // t.every))
    planned += stages * t.elites * t.evaluations
    return min(planned, b.evaluations) if b.evaluations else planned


def print_summary(console: Console, loop: OptimizeLoop, summary: LoopSummary) -> None:
    """The archive table, then the best kernel."""
    table = Table(title=f"archive ({len(loop.strategy.archive)} elites, coverage {summary.coverage:.0%} of cells)")
    for col in ("island", "cell (mem,cmp,par)", "kernel", "params", "outcome", "speedup", "ms"):
        table.add_column(col)
    for cell in loop.strategy.archive:
        rec = cell.record
        table.add_row(
            str(cell.island), str(tuple(cell.coords)), cell.candidate.label + (" (migrant)" if cell.migrated else ""),
            ", ".join(f"{k}={v}" for k, v in cell.candidate.params.items()), rec.outcome.value,
            f"{rec.speedup:.2f}x" if rec.speedup else "-", f"{rec.timing.median_ms:.3f}" if rec.timing else "-",
        )
    console.print(table)
    best = summary.best
    console.print(f"stopped: {summary.stop_reason} · {summary.generations} generations, {summary.evaluations} evaluations")
    usage = getattr(loop.generator, "usage", None)  # an LLM ensemble reports its spend
    if callable(usage):
        u = usage()
        console.print(f"LLM: {u['calls']} calls, {u['tokens_in'] + u['tokens_out']} tokens, ${u['cost_usd']:.4f}")
    if best is None or not best.record.is_correct:
        console.print("[red]no correct kernel found[/red]")
        return
    rec = best.record
    seed = f", {summary.speedup_over_seed:.1f}x faster than the naive seed" if summary.speedup_over_seed else ""
    spread = f" (IQR {rec.timing.iqr_ms:.3f} ms, n={rec.timing.n})" if rec.timing else ""
    console.print(
        f"[bold green]best kernel:[/bold green] {best.candidate.label} {best.candidate.params} · "
        f"{rec.timing.median_ms if rec.timing else float('nan'):.3f} ms{spread} · "
        f"{rec.speedup:.2f}x vs the reference{seed}"
        + (" [yellow](flagged for review)[/yellow]" if rec.roofline_flag else "")
    )
    if summary.exported:
        console.print(f"exported: {summary.exported}")
    console.print(f"run folder: {summary.run_dir}   (resume: kf-run resume {summary.run_dir})")


def run_loop(config: RunConfig, problem_path: Path, shapes: dict[str, Any], run_id: str, run_dir: Path,
             seed_kernel: Path | None, console: Console) -> LoopSummary:
    """Build the problem, evaluator and loop for a run folder and run it to the end."""
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem

    problem = load_problem(problem_path, shapes)
    store = Store(run_dir / STORE_FILE)
    store.save_run(run_id, problem.name, config.model_dump(mode="json"))
    evaluator = Evaluator(problem, config, store, run_id)
    observer = RichObserver(console, budget_total(config))
    loop = OptimizeLoop(config, problem, evaluator, store, run_id, run_dir, observer=observer, seed_kernel=seed_kernel)
    try:
        summary = loop.run()
    finally:
        observer.stop()
    print_summary(console, loop, summary)
    return summary


@click.command(
    "optimize",
    epilog="""\b
Examples:
  kf-run examples/kernelbench/matmul.py
  kf-run examples/kernelbench/softmax.py --set search.name=ga --set budget.generations=4
  kf-run examples/kernelbench/matmul.py --shape M=512 --set budget.wall_time_s=300
""",
)
@click.argument("problem", required=False)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML run config.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a config value.")
@click.option("--shape", "shape_items", multiple=True, metavar="NAME=VALUE", help="Override a shape constant.")
@click.option("--seed-kernel", type=click.Path(dir_okay=False, exists=True), help="Naive seed kernel to start from.")
def command(problem: str | None, config_path: str | None, overrides: tuple[str, ...], shape_items: tuple[str, ...],
            seed_kernel: str | None) -> None:
    """Optimize PROBLEM (a KernelBench .py file or a native task .toml): search, evaluate, tune, export."""
    from kfoundry.core.problem import parse_shape_overrides

    config = load_config(config_path, overrides)
    path_text = problem or config.problem.path
    if not path_text:
        raise ConfigError("no problem given: kf-run PROBLEM (or problem.path in the config)")
    path = Path(path_text)
    shapes = {**config.problem.shapes, **parse_shape_overrides(list(shape_items))}
    language = _language(config)
    seed = Path(seed_kernel) if seed_kernel else find_seed_kernel(path, language)
    if not path.is_file():
        raise ConfigError(f"problem file not found: {path}")
    run_id, run_dir = new_run_dir(config, path.stem)
    write_run_file(run_dir, run_id, path, shapes, config, seed)
    run_loop(config, path, shapes, run_id, run_dir, seed, Console())


def _language(config: RunConfig) -> str:
    """The configured backend's kernel language, read from its class (no device is touched)."""
    from kfoundry.core.plugins import get_plugin

    try:
        factory = get_plugin("backend", config.backend.name).factory
    except KfError:
        return "opencl"  # the evaluator reports an unknown backend properly later
    return str(getattr(factory, "language", "opencl"))
