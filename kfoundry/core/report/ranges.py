"""Shape ranges of an exported package's entries: where a kernel is shape-generic, the range it covers.

A kernel whose sizes are taken from its inputs at call time (rather than baked in) is correct at
shapes it was not tuned on. At export, each entry's kernel, built once as the dispatcher builds it,
runs against the reference at probe shapes: every shape set of the run, a tiny one and ragged ones
between neighbouring sets (odd sizes, off every vector width). When every probe matches, the entry's
``input_ranges`` become, per input dimension, the smallest and largest size probed; calls inside the
range and not on an exact entry go to the ranged entry tuned nearest to them. One failing probe keeps
the entry exact (its own shapes only). Sizes probed are never larger than the run's largest.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: A problem constant is a size (varied by the probes) when it is an integer at least this large in a
#: run of one shape set; in a run of several, the constants that differ between the sets are.
MIN_SIZE = 16
TINY = 7
#: Seconds one entry's probes may take (a child process).
PROBE_TIMEOUT_S = 300


def size_names(shape_sets: Sequence[Mapping[str, Any]], constants: Mapping[str, Any]) -> list[str]:
    """The constants the probes vary (see :data:`MIN_SIZE`)."""
    if len(shape_sets) > 1:
        names = list(shape_sets[0])
        return [n for n in names if len({str(s.get(n)) for s in shape_sets}) > 1]
    return [
        n for n, v in constants.items() if isinstance(v, int) and not isinstance(v, bool) and v >= MIN_SIZE
    ]


def _odd_between(a: int, b: int) -> int:
    mid = int(round(math.sqrt(a * b))) | 1
    return min(max(mid, a + 1), b - 1) if b - a > 2 else a


def probe_shapes(
    base: Mapping[str, Any], shape_sets: Sequence[Mapping[str, Any]], names: Sequence[str]
) -> list[dict[str, Any]]:
    """Constants to probe: every shape set, a tiny one, and ragged ones between neighbouring sizes."""
    sets = [dict(base, **s) for s in shape_sets] or [dict(base)]
    values = {n: sorted({int(s[n]) for s in sets}) for n in names}
    probes = list(sets)
    probes.append(dict(sets[0], **{n: min(TINY, v[0]) for n, v in values.items()}))
    mids = {
        n: [_odd_between(a, b) for a, b in zip(v, v[1:], strict=False)] or [_odd_between(TINY, v[0])]
        for n, v in values.items()
    }
    for k in range(max((len(m) for m in mids.values()), default=0)):
        probes.append(dict(sets[0], **{n: m[k % len(m)] for n, m in mids.items()}))
    out: list[dict[str, Any]] = []
    for p in probes:
        if p not in out:
            out.append(p)
    return out


def _box(shapes: Sequence[list[list[int]]]) -> list[list[list[int]]] | None:
    """Per input and dimension ``[lo, hi]`` over ``shapes``; None when ranks differ between them."""
    first = shapes[0]
    if any(
        len(s) != len(first) or any(len(a) != len(b) for a, b in zip(s, first, strict=True)) for s in shapes
    ):
        return None
    return [
        [[min(s[i][d] for s in shapes), max(s[i][d] for s in shapes)] for d in range(len(first[i]))]
        for i in range(len(first))
    ]


def entry_range(dispatcher: Any, index: int, probes: Sequence[dict[str, Any]], close: Any) -> tuple[Any, str]:
    """The input ranges entry ``index`` is correct over (all ``probes`` pass), or None and why not."""
    from kfoundry.core.problem import load_problem

    entry = dispatcher.entries[index]
    seen: list[list[list[int]]] = []
    for shapes in probes:
        problem = load_problem(dispatcher.reference_file, shapes)
        inputs = problem.make_inputs(104729)
        dims = [list(t.shape) if hasattr(t, "shape") else [] for t in inputs]
        dtypes = [str(getattr(t, "dtype", type(t).__name__)).replace("torch.", "") for t in inputs]
        if dtypes != [str(d).replace("torch.", "") for d in entry["input_dtypes"]]:
            return None, f"dtypes differ at {shapes}"
        try:
            got = dispatcher.run_entry(index, *inputs)
        except Exception as exc:  # a kernel with its sizes baked in may fault or refuse
            return None, f"fails at {shapes}: {type(exc).__name__}"
        if not close(got, problem.make_reference()(*inputs)):
            return None, f"differs from the reference at {shapes}"
        seen.append(dims)
    box = _box(seen)
    return (box, "") if box is not None else (None, "input ranks differ between the probes")


def _probe(
    package: Path, jobs: list[tuple[int, list[dict[str, Any]]]], atol: float, rtol: float
) -> list[Any]:
    """Answers (``{"box", "why"}``) for ``jobs`` from one child process; None for each when it failed."""
    args = [str(package), json.dumps(jobs), str(atol), str(rtol)]
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, *args], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
        answers = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        answers = None
    return answers if isinstance(answers, list) and len(answers) == len(jobs) else [None] * len(jobs)


def add_ranges(
    package: Path,
    entries: list[dict[str, Any]],
    shape_sets: Sequence[Mapping[str, Any]],
    atol: float,
    rtol: float,
) -> None:
    """Set ``input_ranges`` (and the ``probes``) of every shape-generic entry of the package, in place.

    The probes run in a child process: a kernel with its sizes baked in may read past a smaller input,
    and a crash there must cost ranges, not the export (after a crash, each entry is probed alone)."""
    from kfoundry.core.problem import load_problem

    reference = package / json.loads((package / "table.json").read_text())["reference"]
    jobs: list[tuple[int, list[dict[str, Any]]]] = []
    names: dict[int, list[str]] = {}
    for i, entry in enumerate(entries):
        constants = load_problem(reference, entry["shapes"]).shapes
        names[i] = size_names(shape_sets, constants)
        if names[i]:
            jobs.append((i, probe_shapes(constants, shape_sets or [entry["shapes"]], names[i])))
    if not jobs:
        return
    answers = _probe(package, jobs, atol, rtol)
    if len(jobs) > 1 and None in answers:
        answers = [_probe(package, [job], atol, rtol)[0] for job in jobs]
    for (i, probes), answer in zip(jobs, answers, strict=True):
        entry = entries[i]
        if answer is None or answer["box"] is None:
            why = answer["why"] if answer else "the probe process failed (a crash or a timeout)"
            log.info(
                "export: %s on %s is kept for its own shapes only: %s", entry["label"], entry["shapes"], why
            )
            continue
        entry["input_ranges"] = answer["box"]
        entry["probes"] = [{n: p[n] for n in names[i]} for p in probes]


def _child(package: str, jobs: str, atol: str, rtol: str) -> None:
    """Probe entries (the child process of :func:`add_ranges`); prints one ``{"box", "why"}`` per job."""
    import importlib.util

    from kfoundry.core.report.export import _close

    spec = importlib.util.spec_from_file_location("_kf_export_probe", Path(package) / "_dispatch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dispatcher = module.Dispatcher(package)
    out = []
    for index, probes in json.loads(jobs):
        box, why = entry_range(
            dispatcher, int(index), probes, lambda g, w: _close(g, w, float(atol), float(rtol))
        )
        out.append({"box": box, "why": why})
    print(json.dumps(out))


if __name__ == "__main__":
    _child(*sys.argv[1:5])
