"""``kf-run tune``: tune a kernel's template parameters (on the device, or replayed from a recording)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kfoundry.core.config import (
    PluginChoice,
    RunConfig,
    TunerConfig,
    format_validation_error,
    load_config,
    parse_override,
)
from kfoundry.core.errors import ConfigError, PluginError
from kfoundry.core.models import EvalRecord, ParamValue, TunableSpace, TuningResult
from kfoundry.core.plugins import PluginKind, get_plugin_manager
from kfoundry.core.recorded import RecordedSpace, export_t4, replay_objective
from kfoundry.core.tuner import Budget, Trial, run_tuner
from kfoundry.core.tuning import tuning_result

EPILOG = """\b
Examples:
  kf-run tune examples/kernelbench/matmul.py examples/kernelbench/improved/matmul_opencl.py \\
      --shape M=128 --shape N=128 --shape K=128 --param RB=1,2,4,8 --param VW=4,8 \\
      --restrict "RB * VW <= 32" --evaluations 6
  kf-run tune --replay benchmarks/spaces/opencl_matmul_pocl.json --tuner nevergrad --evaluations 50
  kf-run tune --replay my_kernel_tuner_cache.json --tuner bayesian --t4 results.json
  kf-run tune PROBLEM CANDIDATE --shape N=8192 --warm-start runs/ --warm-start other_host_cache.json
"""

log = logging.getLogger(__name__)


class TrialProgress:
    """Progress while tuning: a log line per trial (plain lines without a terminal, ``-v`` on one) and,
    on a terminal, a progress bar over the evaluation budget."""

    def __init__(self, total: int, terminal: bool, level: int = logging.INFO) -> None:
        self.total, self.level, self.count = total, level, 0
        self.best: tuple[float, str] | None = None
        self.bar: Progress | None = None
        if terminal:
            from kfoundry.core import cli

            self.bar = Progress(
                TextColumn("tuning"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=cli.terminal_console or Console(stderr=True),
                transient=True,
            )
            self.task = self.bar.add_task("", total=total)
            self.bar.start()

    def __call__(self, trial: Trial, record: EvalRecord | None = None) -> None:
        self.count += 1
        params = json.dumps(trial.config)
        if trial.value is not None and (self.best is None or trial.value < self.best[0]):
            self.best = (trial.value, params)
        verdict = f"{trial.value:.4f} ms" if trial.value is not None else trial.measurement.invalidity
        if record is not None and record.is_correct and record.speedup:
            verdict += f" {record.speedup:.2f}x"
        best = f"{self.best[0]:.4f} ms {self.best[1]}" if self.best else "none valid yet"
        log.log(
            self.level,
            "tune trial %d/%d%s %s -> %s (best %s)",
            self.count,
            self.total,
            " (seed)" if trial.seeded else "",
            params,
            verdict,
            best,
        )
        if self.bar is not None:
            self.bar.update(self.task, completed=self.count, description=f"best {best}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _terminal() -> bool:
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx else None
    return bool(obj and obj.get("terminal"))


def _value(raw: str) -> ParamValue:
    _, value = parse_override(f"v={raw.strip()}")
    if not isinstance(value, int | float | str | bool):
        raise ConfigError(f"parameter value {raw!r} is not a number, string or boolean")
    return value


def parse_param_values(items: tuple[str, ...]) -> dict[str, list[ParamValue]]:
    """``("TS=8,16,32",)`` -> ``{"TS": [8, 16, 32]}``."""
    out: dict[str, list[ParamValue]] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip() or not raw.strip():
            raise ConfigError(f"--param {item!r}: expected NAME=V1,V2,...")
        out[name.strip()] = [_value(v) for v in raw.split(",")]
    return out


def read_space_file(path: str) -> TunableSpace:
    """A space file: TOML or JSON with ``params`` (name -> values) and optional ``restrictions``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"space file not found: {p}")
    try:
        if p.suffix == ".json":
            data = json.loads(p.read_text())
        else:
            import tomllib

            data = tomllib.loads(p.read_text())
        return TunableSpace.model_validate(data)
    except Exception as exc:
        raise ConfigError(f"space file {p}: {str(exc).splitlines()[0]}") from None


def _validate_plugins(config: RunConfig, with_backend: bool) -> None:
    """Check only the plugins tuning uses (the search and LLM plugins are not needed here)."""
    manager = get_plugin_manager()
    sections: list[tuple[str, PluginKind, PluginChoice]] = [("tuner", "tuner", config.tuner)]
    if with_backend:
        sections += [("backend", "backend", config.backend), ("executor", "executor", config.executor)]
    for key, kind, choice in sections:
        try:
            spec = manager.get(kind, choice.name)
        except PluginError as exc:
            raise ConfigError(f"config error: {key}.name: {exc}") from None
        try:
            spec.options_model.model_validate(choice.options)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, prefix=f"{key}.options")) from None


def _print_result(result: TuningResult, console: Console, first: float | None, trials: bool) -> None:
    if trials:
        table = Table(title=f"trials ({result.tuner})")
        for col in ("#", "params", "time (ms)", "status"):
            table.add_column(col)
        for i, t in enumerate(result.trials):
            time_ms = f"{t['time_ms']:.4f}" if t["time_ms"] is not None else "-"
            status = ("seed " if t["seeded"] else "") + str(t["invalidity"])
            table.add_row(str(i + 1), json.dumps(t["params"]), time_ms, status)
        console.print(table)
    console.print(f"{result.evaluations} configurations evaluated, {result.invalid} invalid")
    if result.best_params is None:
        console.print("[bold red]no valid configuration found[/]")
        return
    console.print(f"best: [bold]{json.dumps(result.best_params)}[/] at {result.best_time_ms:.4f} ms")
    if first is not None and result.best_time_ms:
        console.print(f"speedup over the first evaluated configuration: {first / result.best_time_ms:.3f}x")


@click.command("tune", epilog=EPILOG)
@click.argument("problem", required=False)
@click.argument("candidate", required=False)
@click.option("--tuner", "tuner_name", help="Tuner plugin (default: the config's, bayesian).")
@click.option("--evaluations", type=click.IntRange(min=1), help="Unique configurations to evaluate.")
@click.option("--wall-time", type=click.FloatRange(min=0, min_open=True), help="Wall-time budget in seconds.")
@click.option(
    "--param", "param_values", multiple=True, metavar="NAME=V1,V2,..", help="A tunable and its values."
)
@click.option(
    "--restrict", "restrictions", multiple=True, metavar="EXPR", help="A restriction, e.g. 'TS % WPT == 0'."
)
@click.option("--space", "space_file", help="Space file (TOML/JSON: params, restrictions).")
@click.option(
    "--block", "block", multiple=True, metavar="EXPR", help="Work-group size per dimension (device limit)."
)
@click.option(
    "--local-mem", help="Local/shared memory bytes a configuration needs (expression; device limit)."
)
@click.option(
    "--params", "params", multiple=True, metavar="NAME=VALUE", help="The candidate's own value (a seed)."
)
@click.option(
    "--replay", help="Replay a recorded space (Kernel Tuner cache JSON) instead of running kernels."
)
@click.option("--record", help="Append every trial to this Kernel Tuner cache file.")
@click.option("--t4", "t4_path", help="Write the trials in T4 format to this file.")
@click.option("--seed", type=int, default=None, help="Random seed of the tuner (default: the config's).")
@click.option(
    "--warm-start",
    "warm_start",
    multiple=True,
    metavar="PATH",
    help="Warm-start from earlier results: a run folder, store, Kernel Tuner cache or a directory of them.",
)
@click.option("--backend", help="Backend plugin (default: the config's, opencl).")
@click.option("--device", help="Device index or name substring.")
@click.option(
    "--shape", "shapes", multiple=True, metavar="NAME=VALUE", help="Override a problem shape constant."
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML run config.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a config value.")
@click.option("--trials", "show_trials", is_flag=True, help="Print every trial.")
@click.option("--json", "as_json", is_flag=True, help="Print the tuning result as JSON.")
def command(
    problem: str | None,
    candidate: str | None,
    tuner_name: str | None,
    evaluations: int | None,
    wall_time: float | None,
    param_values: tuple[str, ...],
    restrictions: tuple[str, ...],
    space_file: str | None,
    block: tuple[str, ...],
    local_mem: str | None,
    params: tuple[str, ...],
    replay: str | None,
    record: str | None,
    t4_path: str | None,
    seed: int | None,
    warm_start: tuple[str, ...],
    backend: str | None,
    device: str | None,
    shapes: tuple[str, ...],
    config_path: str | None,
    overrides: tuple[str, ...],
    show_trials: bool,
    as_json: bool,
) -> None:
    """Tune the template parameters of CANDIDATE on PROBLEM (or replay a recorded space with --replay)."""
    sets = list(overrides)
    if tuner_name:
        sets.append(f"tuner.name={json.dumps(tuner_name)}")
    if evaluations:
        sets.append(f"tuner.evaluations={evaluations}")
    if backend:
        sets.append(f"backend.name={json.dumps(backend)}")
    if device is not None:
        sets.append(f"backend.device={json.dumps(device)}")
    if warm_start:
        sets.append(f"tuner.warm_start={json.dumps(list(warm_start))}")
    config = load_config(config_path, sets, validate_plugins=False)
    _validate_plugins(config, with_backend=not replay)
    from kfoundry.core.warm_start import load_sources

    load_sources(config.tuner.warm_start)  # a missing or unreadable source fails before anything runs
    run_seed = config.seed if seed is None else seed
    console = Console(stderr=as_json)
    if replay:
        result, first = _replay(replay, config.tuner, wall_time, run_seed, t4_path, console)
    else:
        if not problem or not candidate:
            raise ConfigError("kf-run tune needs PROBLEM and CANDIDATE (or --replay SPACE.json)")
        extra = read_space_file(space_file) if space_file else None
        cli_space = TunableSpace(params=parse_param_values(param_values), restrictions=list(restrictions))
        result, first = _on_device(
            problem,
            candidate,
            config,
            extra,
            cli_space,
            list(block) or None,
            local_mem,
            params,
            shapes,
            wall_time,
            run_seed,
            record,
            t4_path,
        )
    if as_json:
        click.echo(result.model_dump_json(indent=2))
    else:
        _print_result(result, console, first, show_trials)
    sys.exit(0 if result.best_params is not None else 1)


def _replay(
    path: str,
    tuner_config: TunerConfig,
    wall_time: float | None,
    seed: int,
    t4_path: str | None,
    console: Console,
) -> tuple[TuningResult, float | None]:
    from kfoundry.core.config import build_plugin

    recorded = RecordedSpace.load(path)
    console.print(f"replaying {recorded.describe()}")
    space = recorded.space()
    tuner = build_plugin(tuner_config, "tuner")
    budget = Budget(evaluations=tuner_config.evaluations, wall_time_s=wall_time)
    log.info(
        "replaying %s with %s, %d evaluations", recorded.name, tuner_config.name, tuner_config.evaluations
    )
    progress = TrialProgress(
        tuner_config.evaluations, terminal=False, level=logging.DEBUG
    )  # no device: instant
    trace = run_tuner(space, replay_objective(recorded), tuner, budget, seed=seed, on_trial=progress)
    if t4_path:
        export_t4(t4_path, trace.trials, space.params)
    result = tuning_result(trace, tuner_config.name)
    if result.best_time_ms is not None:
        console.print(f"best/optimum of the recorded space: {result.best_time_ms / recorded.optimum:.4f}")
    first = trace.trials[0].value if trace.trials else None
    return result, first


def _on_device(
    problem: str,
    candidate: str,
    config: Any,
    extra: TunableSpace | None,
    cli_space: TunableSpace,
    block: list[str] | None,
    local_mem: str | None,
    params: tuple[str, ...],
    shapes: tuple[str, ...],
    wall_time: float | None,
    seed: int,
    record: str | None,
    t4_path: str | None,
) -> tuple[TuningResult, float | None]:
    from kfoundry.core.commands.eval import parse_params, read_candidate
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem, parse_shape_overrides
    from kfoundry.core.store import Store
    from kfoundry.core.tuning import candidate_space, merge_spaces, native_block, tune_candidate

    prob = load_problem(problem, dict(config.problem.shapes) | parse_shape_overrides(shapes))
    cand = read_candidate(candidate, parse_params(params))
    meta = dict(cand.meta)
    if block:
        meta["block"] = block
    if local_mem:
        meta["local_mem"] = local_mem
    cand = cand.model_copy(update={"meta": meta})
    firsts: list[float | None] = []
    progress: TrialProgress | None = None

    def on_trial(trial: Trial, rec: EvalRecord) -> None:
        if not firsts:
            firsts.append(trial.value)
        if progress is not None:
            progress(trial, rec)

    store = Store(Path(config.output_dir) / "eval-cache.sqlite")
    try:
        log.info(
            "tuning %s on %s %s: timing the reference on %s",
            cand.label or candidate,
            prob.name,
            prob.shapes,
            config.backend.name,
        )
        with Evaluator(prob, config, store=store) as evaluator:
            space = candidate_space(
                cand,
                evaluator.device,
                prob.space,
                merge_spaces(extra, cli_space),
                constants=prob.shapes,
                problem_block=native_block(prob),
            )
            total = min(config.tuner.evaluations, space.size)
            log.info(
                "tuning on %s: %d valid configurations, %d evaluations with %s",
                evaluator.device.name,
                space.size,
                total,
                config.tuner.name,
            )
            progress = TrialProgress(total, _terminal())
            result = tune_candidate(
                evaluator,
                cand,
                config.tuner,
                space=space,
                wall_time_s=wall_time,
                seed=seed,
                record_path=record,
                t4_path=t4_path,
                on_trial=on_trial,
            )
    finally:
        if progress is not None:
            progress.close()
        store.close()
    return result, firsts[0] if firsts else None
