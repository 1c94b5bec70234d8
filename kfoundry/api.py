"""The Python API: ``kfoundry.optimize``, ``evaluate``, ``tune`` and ``export``, with typed results.

The ``kf-run`` commands are thin layers over these functions::

    import kfoundry
    r = kfoundry.optimize("examples/kernelbench/softmax.py", generations=2)
    print(r.best.speedup, r.run_dir)
    pkg = kfoundry.export(r.run_dir, to="softmax_kernels")

Progress goes to the ``kfoundry`` loggers (stdlib ``logging``: one INFO line per evaluation and per
generation); nothing is printed unless the caller configures logging.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from kfoundry.core.config import RunConfig, load_config
from kfoundry.core.errors import ConfigError, KfError
from kfoundry.core.models import ArchiveCell, Candidate, EvalRecord, ParamValue, TuningResult

if TYPE_CHECKING:
    from kfoundry.core.loop import LoopObserver, LoopSummary, OptimizeLoop

log = logging.getLogger(__name__)

ShapeSet = dict[str, int | float]


class KernelResult(BaseModel):
    """One kernel and its verdict (the best of a run, or the seed)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    candidate: Candidate
    record: EvalRecord

    @property
    def label(self) -> str:
        return self.candidate.label

    @property
    def params(self) -> dict[str, ParamValue]:
        return self.candidate.params

    @property
    def source(self) -> str:
        return self.candidate.source

    @property
    def is_correct(self) -> bool:
        return self.record.is_correct

    @property
    def speedup(self) -> float | None:
        """Speed over the PyTorch reference (geo-mean over the shape sets of a multi-shape run)."""
        return self.record.speedup

    @property
    def median_ms(self) -> float | None:
        return self.record.timing.median_ms if self.record.timing else None


class ShapeResult(BaseModel):
    """One shape set's verdict of a kernel (multi-shape runs keep one per shape set)."""

    shapes: ShapeSet
    outcome: str
    speedup: float | None = None
    median_ms: float | None = None
    reference_ms: float | None = None
    eval_key: str = ""


class OptimizeResult(BaseModel):
    """What :func:`optimize` (and ``kf-run``) leaves: the run folder, the best kernel, the archive."""

    run_id: str
    run_dir: Path
    problem: str
    stop_reason: str
    generations: int
    evaluations: int
    coverage: float
    best: KernelResult | None = None
    seed: KernelResult | None = None
    shape_sets: list[ShapeSet] = Field(default_factory=list)
    best_per_shape: list[ShapeResult] = Field(default_factory=list)
    archive: list[ArchiveCell] = Field(default_factory=list)
    llm_usage: dict[str, Any] | None = None
    exported: Path | None = None
    report: Path | None = None

    @property
    def speedup_over_seed(self) -> float | None:
        """Best time over the naive seed's time (both measured by the same harness)."""
        b, s = self.best, self.seed
        if not (b and s and b.median_ms and s.median_ms):
            return None
        return s.median_ms / b.median_ms

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``: the run, the best kernel (without its source) and the per-shape table."""
        best = self.best
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "problem": self.problem,
            "stop_reason": self.stop_reason,
            "generations": self.generations,
            "evaluations": self.evaluations,
            "coverage": self.coverage,
            "best": None
            if best is None
            else {
                "label": best.label,
                "params": best.params,
                "outcome": best.record.outcome.value,
                "speedup": best.speedup,
                "median_ms": best.median_ms,
                "candidate_hash": best.candidate.content_hash,
                "roofline_flag": best.record.roofline_flag,
            },
            "speedup_over_seed": self.speedup_over_seed,
            "shape_sets": self.shape_sets,
            "best_per_shape": [s.model_dump() for s in self.best_per_shape],
            "archive_cells": len(self.archive),
            "llm_usage": self.llm_usage,
            "exported": str(self.exported) if self.exported else None,
            "report": str(self.report) if self.report else None,
        }


class ExportResult(BaseModel):
    """An exported package: where it is and what its dispatch table holds."""

    package_dir: Path
    module: str
    entries: int
    header: Path | None = None
    #: Entries left out because they failed the export-time check on this machine (and why).
    rejected: list[str] = Field(default_factory=list)


# -- helpers ---------------------------------------------------------------------------------------


def _config(config: RunConfig | str | Path | None, overrides: Sequence[str]) -> RunConfig:
    if isinstance(config, RunConfig):
        return (
            load_config(data=config.model_dump(mode="json"), overrides=list(overrides))
            if overrides
            else config
        )
    return load_config(str(config) if config is not None else None, list(overrides))


def _language(config: RunConfig) -> str:
    """The configured backend's kernel language, read from its class (no device is touched)."""
    from kfoundry.core.plugins import get_plugin

    try:
        factory = get_plugin("backend", config.backend.name).factory
    except KfError:
        return "opencl"  # the evaluator reports an unknown backend properly later
    return str(getattr(factory, "language", "opencl"))


def shape_sets_of(
    config: RunConfig, shapes: ShapeSet | None = None, shape_sets: Sequence[ShapeSet] | None = None
) -> list[ShapeSet]:
    """The shape sets a run covers: ``shape_sets`` (argument, else ``problem.shape_sets``), each over
    ``problem.shapes`` and ``shapes``; a single set (possibly empty: the problem's own constants) otherwise."""
    base = {**config.problem.shapes, **(shapes or {})}
    sets = list(shape_sets) if shape_sets else list(getattr(config.problem, "shape_sets", []) or [])
    if not sets:
        return [base]
    out: list[ShapeSet] = []
    for s in sets:
        merged = {**base, **s}
        if merged not in out:
            out.append(merged)
    return out


def _candidate(candidate: Candidate | str | Path, params: dict[str, ParamValue] | None) -> Candidate:
    from kfoundry.core.commands.eval import read_candidate

    if isinstance(candidate, Candidate):
        return candidate.with_params({**candidate.params, **params}) if params else candidate
    return read_candidate(candidate, params)


def result_of(loop: OptimizeLoop, summary: LoopSummary) -> OptimizeResult:
    """The typed result of a finished loop."""
    from kfoundry.core.search import SearchResult

    best = summary.best
    if best is None:  # a budget stopped generation 0 before the strategy was told: its fastest correct row
        done = [
            r for r in loop.rows() if r.candidate is not None and r.record is not None and r.record.is_correct
        ]
        fastest = max(done, key=lambda r: r.record.speedup or 0.0 if r.record else 0.0, default=None)
        if fastest is not None and fastest.candidate is not None and fastest.record is not None:
            best = SearchResult(
                ask=fastest.ask,
                candidate=fastest.candidate,
                record=fastest.record,
                coords=fastest.coords or (),
            )
    seed = loop.seed_record
    seed_result = None
    if seed is not None:
        for row in loop.rows(0):
            if row.candidate is not None and row.record is seed:
                seed_result = KernelResult(candidate=row.candidate, record=seed)
    usage = getattr(loop.generator, "usage", None)
    sets = list(getattr(loop.evaluator, "shape_sets", []) or [])
    return OptimizeResult(
        run_id=summary.run_id,
        run_dir=summary.run_dir,
        problem=loop.problem.name,
        stop_reason=summary.stop_reason,
        generations=summary.generations,
        evaluations=summary.evaluations,
        coverage=summary.coverage,
        best=KernelResult(candidate=best.candidate, record=best.record) if best is not None else None,
        seed=seed_result,
        shape_sets=sets,
        best_per_shape=[ShapeResult.model_validate(s) for s in best.record.resources.get("per_shape", [])]
        if best is not None
        else [],
        archive=list(loop.strategy.archive),
        llm_usage=usage() if callable(usage) else None,
        exported=summary.exported,
    )


@contextmanager
def open_loop(
    config: RunConfig,
    problem_path: Path,
    shape_sets: list[ShapeSet],
    run_id: str,
    run_dir: Path,
    seed_kernel: Path | None,
    observer: LoopObserver | None = None,
) -> Iterator[OptimizeLoop]:
    """The problem(s), evaluator(s), store and loop of a run folder; closed on exit."""
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.loop import STORE_FILE, OptimizeLoop, ShapeSetEvaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    problems = [load_problem(problem_path, s) for s in shape_sets or [{}]]
    store = Store(run_dir / STORE_FILE, lock=True)  # one writer per run folder
    store.save_run(run_id, problems[0].name, config.model_dump(mode="json"))
    evaluators: list[Any] = []
    try:
        for p in problems:
            evaluators.append(Evaluator(p, config, store, run_id))
        evaluator: Any = evaluators[0] if len(evaluators) == 1 else ShapeSetEvaluator(evaluators, shape_sets)
        yield OptimizeLoop(
            config, problems[0], evaluator, store, run_id, run_dir, observer=observer, seed_kernel=seed_kernel
        )
    finally:
        for e in evaluators:
            e.close()
        store.close()


def run_folder(
    config: RunConfig,
    problem_path: Path,
    shape_sets: list[ShapeSet],
    run_id: str,
    run_dir: Path,
    seed_kernel: Path | None,
    observer: LoopObserver | None = None,
    report: bool = True,
) -> OptimizeResult:
    """Run (or continue) the optimisation of a run folder to the end; writes ``report.html`` after."""
    with open_loop(config, problem_path, shape_sets, run_id, run_dir, seed_kernel, observer) as loop:
        summary = loop.run()
        result = result_of(loop, summary)
    if report:
        result.report = write_report(run_dir)
    return result


def write_report(run_dir: Path) -> Path | None:
    """Write ``report.html`` into a run folder; a failure costs a warning (the run's results stand)."""
    try:
        from kfoundry.core.report import write_report as _write
    except ImportError as exc:
        log.warning("no report written: %s (install kfoundry[report])", exc)
        return None
    try:
        return _write(run_dir)
    except ImportError as exc:  # an optional dependency of the charts (plotly) is missing
        log.warning("no report written: %s", exc)
        return None
    except (KfError, OSError, ValueError) as exc:
        log.warning("no report written for %s: %s", run_dir, exc)
        return None


# -- the API ---------------------------------------------------------------------------------------


def optimize(
    problem: str | Path,
    *,
    config: RunConfig | str | Path | None = None,
    generations: int | None = None,
    overrides: Sequence[str] = (),
    shapes: ShapeSet | None = None,
    shape_sets: Sequence[ShapeSet] | None = None,
    seed_kernel: str | Path | None = None,
    output_dir: str | Path | None = None,
    observer: LoopObserver | None = None,
    report: bool = True,
) -> OptimizeResult:
    """Optimize ``problem`` (a KernelBench ``.py`` or native ``.toml``) in a new run folder.

    ``config`` is a :class:`RunConfig`, a TOML path or None (defaults); ``overrides`` are
    ``KEY.PATH=VALUE`` strings as for ``--set``; ``generations`` and ``output_dir`` are shortcuts for
    two of them. ``shape_sets`` runs over several shape sets (geo-mean fitness, per-shape results);
    the seed kernel defaults to the examples' ``seeds/<stem>_<language>.py`` when it exists.
    """
    from kfoundry.core.loop import find_seed_kernel, new_run_dir, write_run_file

    sets = list(overrides)
    if generations is not None:
        sets.append(f"budget.generations={int(generations)}")
    if output_dir is not None:
        sets.append(f"output_dir={json.dumps(str(output_dir))}")
    cfg = _config(config, sets)
    path = Path(problem)
    if not path.is_file():
        raise ConfigError(f"problem file not found: {path}")
    all_sets = shape_sets_of(cfg, shapes, shape_sets)
    seed = Path(seed_kernel) if seed_kernel else find_seed_kernel(path, _language(cfg))
    _check_warm_start(cfg)
    _refuse_unsupported(cfg, path, all_sets[0], _language(cfg))  # before the run folder exists
    run_id, run_dir = new_run_dir(cfg, path.stem)
    write_run_file(run_dir, run_id, path, all_sets[0], cfg, seed, shape_sets=all_sets)
    return run_folder(cfg, path, all_sets, run_id, run_dir, seed, observer, report=report)


def _check_warm_start(cfg: RunConfig) -> None:
    """A missing or unreadable ``tuner.warm_start`` source fails before anything runs."""
    from kfoundry.core.warm_start import load_sources

    load_sources(cfg.tuner.warm_start)


def _refuse_unsupported(cfg: RunConfig, path: Path, shapes: dict[str, Any], language: str) -> None:
    """Stop with a config error when every configured generator's ``check`` refuses the KernelBench problem."""
    from kfoundry.core.generator import GeneratorUnsupported, ProblemSummary, refuse_unsupported
    from kfoundry.core.plugins import get_plugin

    if path.suffix != ".py":
        return
    try:
        generators = [get_plugin("llm", c.name).build(c.options) for c in cfg.llms]
    except KfError:
        return  # the run reports an unknown generator with its context
    summary = ProblemSummary(
        name=path.stem, reference_source=path.read_text(), shapes=dict(shapes), path=str(path)
    )
    try:
        refuse_unsupported(generators, summary, language)
    except GeneratorUnsupported as exc:
        raise ConfigError(str(exc)) from None


def resume(
    run_dir: str | Path,
    *,
    overrides: Sequence[str] = (),
    observer: LoopObserver | None = None,
    report: bool = True,
) -> OptimizeResult:
    """Continue a stopped or killed run where it left off (``overrides`` may raise its budgets)."""
    from kfoundry.core.loop import read_run_file, run_shape_sets

    folder = Path(run_dir)
    info = read_run_file(folder)
    cfg = load_config(data=info["config"], overrides=list(overrides))
    seed = Path(info["seed_kernel"]) if info.get("seed_kernel") else None
    return run_folder(
        cfg,
        Path(info["problem"]),
        run_shape_sets(info),
        info["run_id"],
        folder,
        seed,
        observer,
        report=report,
    )


def evaluate(
    problem: str | Path,
    candidate: Candidate | str | Path,
    *,
    params: dict[str, ParamValue] | None = None,
    shapes: ShapeSet | None = None,
    config: RunConfig | str | Path | None = None,
    overrides: Sequence[str] = (),
) -> EvalRecord:
    """Judge one kernel (a file or a :class:`Candidate`) on ``problem``: verdict, timing, speedup."""
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    cfg = _config(config, overrides)
    prob = load_problem(problem, {**cfg.problem.shapes, **(shapes or {})})
    cand = _candidate(candidate, params)
    store = Store(Path(cfg.output_dir) / "eval-cache.sqlite")
    try:
        with Evaluator(prob, cfg, store=store) as evaluator:
            return evaluator.evaluate(cand)
    finally:
        store.close()


def tune(
    problem: str | Path,
    candidate: Candidate | str | Path,
    *,
    params: dict[str, ParamValue] | None = None,
    evaluations: int | None = None,
    tuner: str | None = None,
    wall_time_s: float | None = None,
    shapes: ShapeSet | None = None,
    config: RunConfig | str | Path | None = None,
    overrides: Sequence[str] = (),
    warm_start: Sequence[str | Path] = (),
) -> TuningResult:
    """Tune a kernel's template parameters (the space its source declares) on ``problem``.

    The first configurations tried come from the performance database: earlier tunings in
    ``output_dir`` and the run folders, stores or Kernel Tuner cache files named in ``warm_start``."""
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store
    from kfoundry.core.tuning import tune_candidate

    sets = list(overrides)
    if tuner:
        sets.append(f"tuner.name={json.dumps(tuner)}")
    if warm_start:
        sets.append(f"tuner.warm_start={json.dumps([str(w) for w in warm_start])}")
    cfg = _config(config, sets)
    _check_warm_start(cfg)
    prob = load_problem(problem, {**cfg.problem.shapes, **(shapes or {})})
    cand = _candidate(candidate, params)
    store = Store(Path(cfg.output_dir) / "eval-cache.sqlite")
    try:
        with Evaluator(prob, cfg, store=store) as evaluator:
            return tune_candidate(
                evaluator, cand, cfg.tuner, evaluations=evaluations, wall_time_s=wall_time_s, seed=cfg.seed
            )
    finally:
        store.close()


def export(
    run_dir: str | Path, to: str | Path, *, header: bool = False, name: str | None = None, verify: int = 5
) -> ExportResult:
    """Write RUN_DIR's kernels as an importable package at ``to`` (dispatch by device, dtype and shape,
    reference fallback); ``header`` also writes a C header of per-device, per-shape defines. Each entry
    is checked against the reference on ``verify`` fresh inputs here first; one that fails is left out."""
    from kfoundry.core.report.export import export_run

    return export_run(Path(run_dir), Path(to), header=header, name=name, verify=verify)
