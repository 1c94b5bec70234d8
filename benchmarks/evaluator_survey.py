"""Every KernelBench problem of ours through kf-run's own evaluator (PoCL, the small shapes): the offline
generator's recipes, highest rank first (at most ``--tries``), until one is judged correct; one line per
problem (OK, or BAD with each tried recipe's verdict). Unlike ``kernelbench.py``'s check against eager on
one input, this runs every trial the evaluator runs (boundary shapes, extreme and non-finite values, the
calibrated float64 tolerance).

    python benchmarks/evaluator_survey.py                 # all 173 (about 15 minutes on 2 cores)
    python benchmarks/evaluator_survey.py sdpa norm       # names containing any of these
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from eval_helpers import fast_config  # noqa: E402

from kfoundry.core.evaluation import Evaluator  # noqa: E402
from kfoundry.core.models import Outcome  # noqa: E402
from kfoundry.core.problem import load_problem  # noqa: E402
from kfoundry.plugins.llms.offline.generator import OfflineGenerator  # noqa: E402

DATA = ROOT / "tests" / "data" / "kernelbench"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("only", nargs="*", help="problems whose name contains any of these")
    ap.add_argument("--tries", type=int, default=3, help="recipes tried per problem, highest rank first")
    args = ap.parse_args(argv)
    small: dict[str, dict[str, int | float]] = json.loads((DATA / "small_shapes.json").read_text())
    keys = [k for k in sorted(small) if not args.only or any(o in k for o in args.only)]
    start, bad = time.time(), 0
    for key in keys:
        problem = load_problem(DATA / key, small[key])
        recipes = sorted(OfflineGenerator().recipes(problem.summary(), "opencl"), key=lambda r: -r.rank)
        verdicts: list[str] = []
        ok = False
        with Evaluator(problem, fast_config(cache=False)) as evaluator:
            for recipe in recipes[: args.tries]:
                record = evaluator.evaluate_many([recipe.candidate()])[0]
                if record.outcome is Outcome.correct:
                    ok = True
                    break
                verdicts.append(f"{recipe.name}: {record.outcome.value}: {(record.message or '')[:200]}")
        bad += not ok
        line = "OK  " + key if ok else "BAD " + key + " " + " | ".join(verdicts)
        print(f"{line} ({time.time() - start:.0f} s)", flush=True)
    print(f"{len(keys) - bad}/{len(keys)} with a correct recipe among the first {args.tries}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
