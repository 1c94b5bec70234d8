"""The export step: the best correct kernel written to the run folder, with ``best.json``."""

from __future__ import annotations

import json
from pathlib import Path

from kfoundry.core.languages import export_suffix
from kfoundry.core.search import SearchResult


def export_best(best: SearchResult | None, problem_name: str, run_dir: Path) -> Path | None:
    """Write the best kernel, if correct, as a standalone file (a KernelBench ``ModelNew`` ``.py`` with
    a header, or the native kernel with its language's export suffix); returns its path."""
    if best is None or not best.record.is_correct:
        return None
    cand = best.candidate
    suffix = ".py" if cand.kind == "kernelbench" else export_suffix(cand.language)
    path = run_dir / f"best_{problem_name}_{cand.language}{suffix}"
    header = ""
    if cand.kind == "kernelbench":
        speed = f"{best.record.speedup:.2f}x" if best.record.speedup else "n/a"
        header = (
            f"# kfoundry best kernel for {problem_name}: {cand.label}, speedup {speed} "
            f"over the reference on {best.record.device}\nPARAMS = {cand.params!r}\n\n"
        )
    path.write_text(header + cand.source)
    data = {"candidate": cand.model_dump(mode="json"), "record": best.record.model_dump(mode="json")}
    (run_dir / "best.json").write_text(json.dumps(data, indent=2))
    return path
