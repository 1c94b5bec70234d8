"""``kf-run export RUN_DIR --to DIR``: a run's kernels as an importable Python package.

The package holds a dispatch table (backend, device, input shapes and dtypes → kernel and parameters)
built from the run's per-shape results: for every shape set, the kernel that was fastest on it. A call
is checked before it launches and falls back to the PyTorch reference, with one warning, for anything
the table does not cover (see :mod:`kfoundry.core.report.dispatch`). ``perf.json`` keeps the
performance data the table was built from; ``--header`` also writes a C header of per-device,
per-shape ``#define``s (Kernel Tuner's ``TARGET_<device>`` convention).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

from kfoundry.api import ExportResult
from kfoundry.core.errors import ConfigError
from kfoundry.core.languages import UnknownLanguage, export_suffix
from kfoundry.core.models import Candidate
from kfoundry.core.report.data import RunData, RunFolderError, best_per_shape, load_run, per_shape_results

log = logging.getLogger(__name__)

TABLE_FILE = "table.json"
PERF_FILE = "perf.json"

_INIT = '''"""{problem} kernels exported by kfoundry from run {run_id}.

    import {name}
    y = {name}.{func}(*inputs)            # a function
    model = {name}.Kernel(); y = model(*inputs)   # an nn.Module

Each call is checked (backend, inputs' device, shapes, dtypes) against the dispatch table in
table.json before a kernel launches; anything the table does not cover runs the PyTorch reference
with one warning. perf.json holds the measurements the table was built from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from ._dispatch import DispatchWarning, Dispatcher

__all__ = ["Kernel", "{func}", "dispatcher", "DispatchWarning", "SHAPE_SETS"]

dispatcher = Dispatcher(Path(__file__).parent)

#: The shape sets the run covered (problem constants), one table entry each.
SHAPE_SETS = {shape_sets!r}


def {func}(*inputs: Any) -> Any:
    """Run the tuned kernel that covers these inputs (or the PyTorch reference, with a warning)."""
    return dispatcher(*inputs)


class Kernel(nn.Module):
    """``{problem}`` as an ``nn.Module`` that dispatches at call time."""

    def forward(self, *inputs: Any) -> Any:
        return dispatcher(*inputs)
'''


def _suffix(language: str) -> str:
    """A kernel file's suffix from its language's registration (``.txt`` for a language not installed)."""
    try:
        return export_suffix(language)
    except UnknownLanguage:
        return ".txt"


def _identifier(name: str) -> str:
    return re.sub(r"\W", "_", name).strip("_") or "kernels"


def _dtype(text: str) -> str:
    return str(text).replace("torch.", "")


def _analysis(
    run: RunData, shapes: dict[str, Any], cand: Candidate
) -> tuple[list[list[int]], list[str], dict[str, Any]]:
    """Input shapes and dtypes of one call on ``shapes``, and the parameter values in force for ``cand``."""
    from kfoundry.core.problem import load_problem

    problem = load_problem(run.problem_path, shapes)
    a = problem.analysis()
    return (
        [list(s) for s in a.input_shapes],
        [_dtype(d) for d in a.input_dtypes],
        problem.candidate_params(cand),
    )


def build_table(run: RunData) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The dispatch entries (one per shape set with a correct kernel) and the kernels' sources by file."""
    entries: list[dict[str, Any]] = []
    sources: dict[str, Any] = {}
    for best in best_per_shape(run):
        cand = best.candidate
        record = run.best_record_of(cand.content_hash)
        input_shapes, input_dtypes, params = _analysis(run, best.shapes, cand)
        suffix = ".py" if cand.kind == "kernelbench" else _suffix(cand.language)
        file = f"kernels/k_{cand.content_hash[:12]}{suffix}"
        sources[file] = cand
        entries.append(
            {
                "shapes": best.shapes,
                "input_shapes": input_shapes,
                "input_dtypes": input_dtypes,
                "backend": record.backend if record else run.config.get("backend", {}).get("name", "opencl"),
                "device": record.device if record else "",
                "kernel": file,
                "kind": cand.kind,
                "language": cand.language,
                "label": cand.label,
                "candidate_id": cand.content_hash,
                "params": params,
                "speedup": best.speedup,
                "median_ms": best.median_ms,
                "reference_ms": best.reference_ms,
            }
        )
    return entries, sources


def _perf(run: RunData) -> dict[str, Any]:
    return {
        "problem": run.problem,
        "run_id": run.run_id,
        "shape_sets": run.shape_sets,
        "kernels": [
            {
                "candidate_id": c.content_hash,
                "label": c.label,
                "params": c.params,
                "device": r.device,
                "backend": r.backend,
                "toolchain": r.toolchain,
                "speedup": r.speedup,
                "per_shape": per_shape_results(r, run.shape_sets),
            }
            for c, r in run.correct()
        ],
    }


def _macro(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", text).upper().strip("_")


def _define(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def render_header(problem: str, entries: list[dict[str, Any]]) -> str:
    """A C header: one ``#ifdef TARGET_<device>`` block per device, one ``#if`` per shape set inside."""
    guard = f"KF_{_macro(problem)}_H"
    lines = [
        f"/* kfoundry: tuned parameters for {problem}, per device and shape set. */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
    ]
    by_device: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_device.setdefault(e["device"], []).append(e)
    for n, (device, group) in enumerate(by_device.items()):
        lines.append(f"#{'if' if n == 0 else 'elif'} defined(TARGET_{_macro(device)})")
        lines.extend(_shape_blocks(group))
    if by_device:
        lines.append("#else /* default: the first device's parameters */")
        lines.extend(_shape_blocks(next(iter(by_device.values()))))
        lines.append("#endif")
    lines += ["", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def _shape_blocks(group: list[dict[str, Any]]) -> list[str]:
    out = []
    for i, e in enumerate(group):
        cond = " && ".join(f"(KF_{_macro(k)} == {_define(v)})" for k, v in e["shapes"].items()) or "1"
        out.append(f"  {'#if' if i == 0 else '#elif'} {cond}")
        out.append(f'    #define KF_KERNEL "{e["label"] or e["candidate_id"][:12]}"')
        out.extend(f"    #define {k} {_define(v)}" for k, v in e["params"].items())
    if group:
        out.append("  #endif")
    return out


def _close(got: Any, want: Any, atol: float, rtol: float) -> bool:
    import torch

    gots = list(got) if isinstance(got, (tuple, list)) else [got]
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    return len(gots) == len(wants) and all(
        isinstance(g, torch.Tensor)
        and g.shape == w.shape
        and g.dtype == w.dtype
        and bool(torch.allclose(g, w, atol=atol, rtol=rtol, equal_nan=True))
        for g, w in zip(gots, wants, strict=True)
    )


def verify_package(to: Path, trials: int, atol: float = 1e-4, rtol: float = 1e-4) -> dict[int, str]:
    """Run every entry of a written package against the reference on ``trials`` fresh inputs (through the
    package's own loader, in this process); returns why each failing entry failed."""
    import importlib.util

    from kfoundry.core.problem import load_problem

    spec = importlib.util.spec_from_file_location("_kf_export_check", to / "_dispatch.py")
    if spec is None or spec.loader is None:  # pragma: no cover - the file was just written
        raise ConfigError(f"{to}: cannot load _dispatch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dispatcher = module.Dispatcher(to)
    failed: dict[int, str] = {}
    for i, entry in enumerate(dispatcher.entries):
        problem = load_problem(dispatcher.reference_file, entry["shapes"])
        reference = problem.make_reference()
        for t in range(trials):
            inputs = problem.make_inputs(7919 + t)
            try:
                got = dispatcher.run_entry(i, *inputs)
            except Exception as exc:  # a kernel that does not build or launch here
                failed[i] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                break
            if not _close(got, reference(*inputs), atol, rtol):
                failed[i] = f"differs from the reference on trial {t + 1} of {trials}"
                break
    return failed


def export_run(
    run_dir: Path, to: Path, *, header: bool = False, name: str | None = None, verify: int = 5
) -> ExportResult:
    """Write the package (see the module docstring); refuses a non-empty folder that is not an export."""
    run = load_run(run_dir)
    module = name or to.name
    if not module.isidentifier():
        raise ConfigError(f"--to {to}: {module!r} is not a Python package name (use letters, digits, _)")
    if to.exists() and (not to.is_dir() or (any(to.iterdir()) and not (to / TABLE_FILE).is_file())):
        raise ConfigError(f"--to {to}: exists and is not an earlier kfoundry export; pick another folder")
    entries, sources = build_table(run)
    if not entries:
        raise RunFolderError(f"{run_dir}: no correct kernel to export")
    problem_file = Path(run.problem_path)
    if not problem_file.is_file():
        raise RunFolderError(f"{run_dir}: the problem file {problem_file} is gone; it is the reference")
    if to.exists():
        shutil.rmtree(to)
    (to / "kernels").mkdir(parents=True)
    reference = f"reference{problem_file.suffix}"
    shutil.copyfile(problem_file, to / reference)
    for file, cand in sources.items():
        (to / file).write_text(cand.source)
    (to / "_dispatch.py").write_text((Path(__file__).parent / "dispatch.py").read_text())
    table: dict[str, Any] = {
        "problem": run.problem,
        "run_id": run.run_id,
        "reference": reference,
        "entries": entries,
        "rejected": [],
    }
    (to / TABLE_FILE).write_text(json.dumps(table, indent=2))
    if verify > 0:  # each entry once more on this machine, through the package's own loader
        ev = run.config.get("evaluation", {})
        failed = verify_package(to, verify, atol=ev.get("atol") or 1e-4, rtol=ev.get("rtol") or 1e-4)
        for i, why in sorted(failed.items()):
            e = entries[i]
            log.warning(
                "export: %s on %s left out (the reference runs there): %s", e["label"], e["shapes"], why
            )
            table["rejected"].append({**e, "reason": why})
        table["entries"] = [e for i, e in enumerate(entries) if i not in failed]
        (to / TABLE_FILE).write_text(json.dumps(table, indent=2))
        from kfoundry.core.report.ranges import add_ranges  # shape-generic entries cover a range

        add_ranges(
            to, table["entries"], run.shape_sets, atol=ev.get("atol") or 1e-4, rtol=ev.get("rtol") or 1e-4
        )
        (to / TABLE_FILE).write_text(json.dumps(table, indent=2))
    (to / PERF_FILE).write_text(json.dumps(_perf(run), indent=2))
    func = _identifier(run.problem)
    func = func if func.isidentifier() and func not in {"Kernel", "dispatcher"} else "run"
    (to / "__init__.py").write_text(
        _INIT.format(
            problem=run.problem, run_id=run.run_id, name=module, func=func, shape_sets=run.shape_sets
        )
    )
    header_path = None
    if header:
        header_path = to / f"{func}.h"
        header_path.write_text(render_header(run.problem, table["entries"]))
    return ExportResult(
        package_dir=to,
        module=module,
        entries=len(table["entries"]),
        header=header_path,
        rejected=[f"{e['label']} on {e['shapes']}: {e['reason']}" for e in table["rejected"]],
    )
