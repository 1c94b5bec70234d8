"""``kf-run eval PROBLEM CANDIDATE``: judge one kernel: verdict, timing table, speedup, roofline.

Exit status: 0 when the candidate is correct, 1 when it is not, 2 on bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from kfoundry.core.candidate_file import read_candidate
from kfoundry.core.config import RunConfig, format_validation_error, load_config, parse_override
from kfoundry.core.errors import ConfigError
from kfoundry.core.models import Candidate, EvalRecord, ParamValue, TimingStats
from kfoundry.core.plugins import get_plugin_manager
from kfoundry.core.store import Store


def parse_params(items: tuple[str, ...]) -> dict[str, ParamValue]:
    """``("BLOCK=128", "VEC=true")`` -> ``{"BLOCK": 128, "VEC": True}`` (values read as TOML)."""
    out: dict[str, ParamValue] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--params {item!r}: expected NAME=VALUE")
        path, value = parse_override(item)
        out[".".join(path)] = value
    return out


def _validate_plugins(config: RunConfig) -> str | None:
    """Check the backend's and executor's options; the backend's language where its class declares one."""
    manager = get_plugin_manager()
    for key, kind, choice in (
        ("backend", "backend", config.backend),
        ("executor", "executor", config.executor),
    ):
        try:
            spec = manager.get(kind, choice.name)  # type: ignore[arg-type]
            spec.options_model.model_validate(choice.options)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, prefix=f"{key}.options")) from None
    language = getattr(manager.get("backend", config.backend.name).factory, "language", None)
    return language if isinstance(language, str) else None


def _timing_row(label: str, t: TimingStats | None) -> list[str]:
    if t is None:
        return [label, "-", "-", "-", "-", "-"]
    return [
        label,
        f"{t.median_ms:.4f}",
        f"{t.iqr_ms:.4f}",
        f"[{t.ci95_low_ms:.4f}, {t.ci95_high_ms:.4f}]",
        str(t.n),
        str(t.n_outliers),
    ]


def render(record: EvalRecord, console: Console) -> None:
    """Print a record for people."""
    color = "green" if record.is_correct else "red"
    cached = " (from the store)" if record.cached else ""
    console.print(f"[bold {color}]{record.outcome.value}[/]{cached}: {record.message}")
    console.print(f"problem {record.problem} on {record.device} ({record.toolchain})")
    if record.timing is not None or record.reference_timing is not None:
        table = Table(title="timing (ms)")
        for col in ("kernel", "median", "IQR", "95% CI of median", "n", "outliers"):
            table.add_column(col)
        table.add_row(*_timing_row("candidate", record.timing))
        table.add_row(*_timing_row("reference", record.reference_timing))
        console.print(table)
    if record.speedup is not None:
        console.print(f"speedup over the reference: [bold]{record.speedup:.3f}x[/]")
    if record.roofline_fraction is not None:
        console.print(f"roofline fraction: {record.roofline_fraction:.3f}")
    if record.roofline_flag:
        console.print(
            "[bold yellow]flagged for review: faster than the roofline or an implausible speedup[/]"
        )
    if not record.is_correct and record.log:
        console.print("[dim]log (tail):[/]")
        console.print(record.log[-2000:], markup=False, highlight=False)


def evaluate(
    problem: str | Path,
    candidate: str | Path | Candidate,
    config: RunConfig,
    shapes: dict[str, int | float] | None = None,
    params: dict[str, ParamValue] | None = None,
) -> EvalRecord:
    """Judge ``candidate`` (a file, or a :class:`Candidate`) on ``problem`` as ``kf-run eval`` does.

    The store is ``<output_dir>/eval-cache.sqlite``; bad input raises a one-line :class:`KfError`.
    """
    # imported here, not at module level: they import torch, which `kf-run --help` need not wait for
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem

    language = _validate_plugins(config)
    prob = load_problem(problem, dict(config.problem.shapes) | dict(shapes or {}))
    cand = candidate if isinstance(candidate, Candidate) else read_candidate(candidate, params, language)
    store = Store(Path(config.output_dir) / "eval-cache.sqlite")
    try:
        with Evaluator(prob, config, store=store) as evaluator:
            return evaluator.evaluate(cand)
    finally:
        store.close()


def evaluate_all(
    problem: str | Path,
    candidates: list[str | Path],
    config: RunConfig,
    shapes: dict[str, int | float] | None = None,
    params: dict[str, ParamValue] | None = None,
) -> list[EvalRecord]:
    """Judge several candidate files on ``problem`` as one batch (the executor runs them concurrently)."""
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem

    language = _validate_plugins(config)
    prob = load_problem(problem, dict(config.problem.shapes) | dict(shapes or {}))
    cands = [read_candidate(c, params, language) for c in candidates]
    store = Store(Path(config.output_dir) / "eval-cache.sqlite")
    try:
        with Evaluator(prob, config, store=store) as evaluator:
            return evaluator.evaluate_many(cands)
    finally:
        store.close()


@click.command(
    "eval",
    epilog="""\b
Examples:
  kf-run eval examples/kernelbench/softmax.py examples/kernelbench/seeds/softmax_opencl.py
  kf-run eval examples/kernelbench/matmul.py examples/kernelbench/improved/matmul_opencl.py --shape M=128 --json
  kf-run eval examples/native/vector_add.toml examples/native/vector_add.cl --params BLOCK=128
  kf-run eval examples/kernelbench/softmax.py examples/kernelbench/seeds/softmax_opencl.py \
      examples/kernelbench/improved/softmax_opencl.py --set executor.options.workers=2
""",
)
@click.argument("problem")
@click.argument("candidates", nargs=-1, required=True, metavar="CANDIDATE...")
@click.option("--backend", help="Backend plugin (default: the config's, opencl).")
@click.option("--device", help="Device index or name substring.")
@click.option(
    "--shape", "shapes", multiple=True, metavar="NAME=VALUE", help="Override a problem shape constant."
)
@click.option("--params", "params", multiple=True, metavar="NAME=VALUE", help="Template parameter value.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML run config.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a config value.")
@click.option("--no-cache", is_flag=True, help="Evaluate again even if the store has this result.")
@click.option("--json", "as_json", is_flag=True, help="Print the evaluation record as JSON.")
def command(
    problem: str,
    candidates: tuple[str, ...],
    backend: str | None,
    device: str | None,
    shapes: tuple[str, ...],
    params: tuple[str, ...],
    config_path: str | None,
    overrides: tuple[str, ...],
    no_cache: bool,
    as_json: bool,
) -> None:
    """Evaluate CANDIDATE (a ModelNew .py, or a native kernel) on PROBLEM; exit 0 if correct, 1 if not.

    Several candidates are judged as one batch (``executor.options.workers`` at once); exit 0 if all
    are correct."""
    sets = list(overrides)
    if backend:
        sets.append(f"backend.name={json.dumps(backend)}")
    if device is not None:
        sets.append(f"backend.device={json.dumps(device)}")
    if no_cache:
        sets.append("evaluation.cache=false")
    from kfoundry.core.problem import parse_shape_overrides

    config = load_config(config_path, sets, validate_plugins=False)
    if len(candidates) > 1:
        records = evaluate_all(
            problem, list(candidates), config, parse_shape_overrides(shapes), parse_params(params)
        )
        if as_json:
            click.echo("[" + ",\n".join(r.model_dump_json(indent=2) for r in records) + "]")
        else:
            for name, rec in zip(candidates, records, strict=True):
                Console().rule(name)
                render(rec, Console())
        sys.exit(0 if all(r.is_correct for r in records) else 1)
    record = evaluate(problem, candidates[0], config, parse_shape_overrides(shapes), parse_params(params))
    if as_json:
        click.echo(record.model_dump_json(indent=2))
    else:
        render(record, Console())
    sys.exit(0 if record.is_correct else 1)
