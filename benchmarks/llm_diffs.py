"""How often SEARCH/REPLACE diffs apply when the model mangles whitespace, exact vs kfoundry's
tolerant matcher, on the bundled example kernels. Prints a table. "wrong place": applied, but not
where the SEARCH text was cut from; "ambiguous": refused because the text matches several places
(the model is told to quote more lines).

    python benchmarks/llm_diffs.py [--trials 400] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

from kfoundry.core.llm.parsing import ParseFailure, apply_diff

ROOT = Path(__file__).resolve().parents[1]


def _reindent(lines: list[str], rng: random.Random) -> list[str]:
    shift = rng.choice([-4, -2, 2, 4])
    return [(" " * shift + x) if shift > 0 else x[min(-shift, len(x) - len(x.lstrip())) :] for x in lines]


PERTURBATIONS: dict[str, Callable[[list[str], random.Random], list[str]]] = {
    "verbatim": lambda ls, rng: ls,
    "re-indented": _reindent,
    "spaces collapsed": lambda ls, rng: [" ".join(x.split()) for x in ls],
    "blank lines dropped": lambda ls, rng: [x for x in ls if x.strip()],
    "trailing spaces": lambda ls, rng: [x + "  " for x in ls],
    "tabs for indent": lambda ls, rng: [x.replace("    ", "\t") for x in ls],
}


def exact(source: str, search: str, replace: str) -> str:
    if search not in source:
        raise ParseFailure("not found")
    return source.replace(search, replace, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sources = [p.read_text() for p in sorted((ROOT / "examples").rglob("*_opencl.py"))]
    if not sources:
        raise SystemExit("no example kernels found under examples/")
    print(f"{len(sources)} example kernels, {args.trials} diffs per perturbation, seed {args.seed}\n")
    print(f"{'perturbation':<22}{'exact match':>13}{'kfoundry':>11}{'wrong place':>13}{'ambiguous':>11}")
    for name, perturb in PERTURBATIONS.items():
        ok_exact = ok_tol = misplaced = ambiguous = 0
        for _ in range(args.trials):
            src = rng.choice(sources)
            lines = src.split("\n")
            start = rng.randrange(0, max(1, len(lines) - 4))
            block = lines[start : start + rng.randint(2, 4)]
            if not any(x.strip() for x in block):
                block = lines[start : start + 6]
            search = "\n".join(perturb(list(block), rng))
            marker = "// REPLACED"
            expected = "\n".join(lines[:start] + [marker] + lines[start + len(block) :])
            try:
                exact(src, search, marker)
                ok_exact += 1
            except ParseFailure:
                pass
            try:
                out = apply_diff(src, search, marker)
                ok_tol += 1
                if "".join(out.split()) != "".join(expected.split()):  # ignoring whitespace, as models do
                    misplaced += 1
            except ParseFailure as exc:
                ambiguous += "places" in str(exc)
        pct = 100.0 / args.trials
        print(
            f"{name:<22}{ok_exact * pct:>12.1f}%{ok_tol * pct:>10.1f}%{misplaced * pct:>12.1f}%{ambiguous * pct:>10.1f}%"
        )


if __name__ == "__main__":
    main()
