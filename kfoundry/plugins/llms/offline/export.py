"""Write every cookbook recipe for a problem as a standalone candidate file (for ``kf-run eval``).

    python -m kfoundry.plugins.llms.offline.export examples/kernelbench/softmax.py --language cuda --out cands/

Each file is a ``ModelNew`` module with its default ``PARAMS`` written at the top; the file name
ends in ``_<language>.py`` so ``kf-run eval`` picks the right backend language.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kfoundry.core.generator import ProblemSummary
from kfoundry.plugins.llms.offline.generator import OfflineGenerator


def export(
    problem_path: Path, language: str, out: Path, shapes: dict[str, int | float] | None = None
) -> list[Path]:
    """Files written, one per recipe."""
    from kfoundry.core.problem import load_problem

    problem = load_problem(problem_path, shapes or {})
    summary = ProblemSummary(
        name=problem.name, reference_source=problem.source, shapes=problem.shapes, path=str(problem_path)
    )
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for recipe in OfflineGenerator().recipes(summary, language):
        path = out / f"{problem.name}_{recipe.name.split('/')[-1]}_{language}.py"
        path.write_text(f"PARAMS = {dict(recipe.defaults)!r}\n\n{recipe.render()}")
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description="Export the offline cookbook's candidates for a problem.")
    parser.add_argument("problem")
    parser.add_argument("--language", default="opencl", choices=["opencl", "cuda"])
    parser.add_argument("--out", default="cookbook")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    from kfoundry.core.problem import parse_shape_overrides

    for path in export(Path(args.problem), args.language, Path(args.out), parse_shape_overrides(args.shape)):
        print(path)


if __name__ == "__main__":
    main()
