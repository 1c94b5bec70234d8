"""The GPU cheat catalogue on a real GPU: every candidate in tests/data/bad_cuda/ through the sandboxed
evaluator (backend cuda, defaults, no cache), beside the honest CUDA example for the same problem and
shapes timed in the same run.

A cheat is caught when its verdict is one its docstring names (``expect=``) and, if judged correct, it is
not faster than the honest control by more than ``max_speedup`` (a cheat on the clock that the judge
turned back into an honest, slow kernel). Prints a table and the count; ``--json`` keeps every record.

    python benchmarks/cuda_trust_cheats.py --json /tmp/cheats.json      # GPU machine, ~3-5 minutes
    python benchmarks/cuda_trust_cheats.py --only g1 g6
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHEATS = ROOT / "tests/data/bad_cuda"
HONEST = ROOT / "examples/kernelbench/cuda"


def _config() -> Any:
    from kfoundry.core.config import load_config

    return load_config(
        data={
            "backend": {"name": "cuda"},
            "executor": {"name": "local", "options": {"workers": 1}},
            "evaluation": {"cache": False, "timeout_s": 300, "memory_limit_mb": None},
        },
        validate_plugins=False,
    )


def _evaluate(problem_name: str, shapes: dict[str, int], path: Path) -> dict[str, Any]:
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.models import Candidate
    from kfoundry.core.problem import load_problem

    problem = load_problem(ROOT / "examples/kernelbench" / f"{problem_name}.py", shapes)
    started = time.perf_counter()
    with Evaluator(problem, _config()) as ev:
        record = ev.evaluate(Candidate(source=path.read_text(), language="cuda", label=path.name))
    keep = (
        "CUDA IPC",
        "judge's clock net",
        "undercut",
        "native code",
        "no CUDA IPC",
        "sandbox protections",
        "clock pairs",
        "differential clock",
        "per-call overhead",
    )
    return {
        "outcome": record.outcome.value,
        "message": record.message[:400],
        "median_ms": record.timing.median_ms if record.timing else None,
        "speedup": record.speedup,
        "wall_s": round(time.perf_counter() - started, 1),
        "log": [ln[:600] for ln in (record.log or "").splitlines() if any(k in ln for k in keep)],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from test_eval_catalogue import parse  # the catalogue's own docstring format

    rows: list[dict[str, Any]] = []
    honest: dict[tuple[str, tuple[tuple[str, int], ...]], dict[str, Any]] = {}
    for path in sorted(CHEATS.glob("g*.py"), key=lambda p: int(p.stem[1:].split("_")[0])):
        if args.only and not any(path.stem.startswith(o + "_") or path.stem == o for o in args.only):
            continue
        entry = parse("bad_cuda", path)
        assert entry is not None, path
        key = (entry.problem, entry.shapes)
        if key not in honest:
            honest[key] = _evaluate(entry.problem, dict(entry.shapes), HONEST / f"{entry.problem}_cuda.py")
            print(
                f"honest {entry.problem} {dict(entry.shapes)}: {honest[key]['outcome']} "
                f"{honest[key]['median_ms']} ms  {honest[key]['log']}",
                flush=True,
            )
        row = _evaluate(entry.problem, dict(entry.shapes), path)
        control = honest[key].get("median_ms")
        vs = control / row["median_ms"] if control and row["median_ms"] else None
        caught = row["outcome"] in entry.expect and not (
            row["outcome"] == "correct"
            and entry.max_speedup is not None
            and (vs is None or vs > entry.max_speedup)
        )
        if entry.hint and row["outcome"] != "correct":
            caught = caught and entry.hint in row["message"]
        row.update(name=path.stem, expect="|".join(sorted(entry.expect)), vs_honest=vs, caught=caught)
        rows.append(row)
        print(
            f"{path.stem:32s} {row['outcome']:10s} vs honest {vs if vs is None else round(vs, 3)!s:>6s} "
            f"{'CAUGHT' if caught else 'MISSED'}  {row['message'][:160]}",
            flush=True,
        )
    print("\n| cheat | verdict | x honest control | caught |\n|---|---|---|---|")
    for r in rows:
        vs = "-" if r["vs_honest"] is None else f"{r['vs_honest']:.2f}"
        print(f"| {r['name']} | {r['outcome']} | {vs} | {'yes' if r['caught'] else 'NO'} |")
    print(
        f"\ncaught {sum(r['caught'] for r in rows)} of {len(rows)}; honest controls: "
        + ", ".join(f"{k[0]} {v['outcome']} {v['median_ms']}" for k, v in honest.items())
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"cheats": rows, "honest": [{"problem": k[0], **v} for k, v in honest.items()]},
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
