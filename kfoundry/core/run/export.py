"""The export step: the best correct kernel written to the run folder, with ``best.json``."""

from __future__ import annotations

import json
from pathlib import Path

from kfoundry.core.languages import export_suffix
from kfoundry.core.search import SearchResult

#: Appended to an exported KernelBench ``ModelNew``: its kernels launch asynchronously, so a caller that
#: reads an output right after a call (the first call builds, and takes long) could read it unfinished.
SYNCHRONIZED_FORWARD = """

# kfoundry: launches are asynchronous; forward waits for its kernels before its outputs are read
from kfoundry.runtime import synchronize as _kf_synchronize  # noqa: E402


class ModelNew(ModelNew):  # type: ignore[no-redef]  # noqa: F811
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        _kf_synchronize()
        return out
"""


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
    path.write_text(header + cand.source + (SYNCHRONIZED_FORWARD if cand.kind == "kernelbench" else ""))
    data = {"candidate": cand.model_dump(mode="json"), "record": best.record.model_dump(mode="json")}
    (run_dir / "best.json").write_text(json.dumps(data, indent=2))
    return path
