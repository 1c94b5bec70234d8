"""How a run's progress reads in its log: each evaluation's verdict and the fastest kernel so far."""

from __future__ import annotations

from kfoundry.core.db.loop import Row
from kfoundry.core.search import SearchResult


def best_text(best: SearchResult | None) -> str:
    """``2.10x (label)`` for a correct best kernel, else ``none correct yet``."""
    if best is None or not best.record.is_correct:
        return "none correct yet"
    return f"{best.record.speedup or 0:.2f}x ({best.candidate.label})"


class Progress:
    """The fastest correct evaluation logged so far (starting from a resumed run's best)."""

    def __init__(self, best: SearchResult | None) -> None:
        correct = best is not None and best.record.is_correct
        self.speedup = (best.record.speedup or 0.0) if best and correct else 0.0
        self.label = best.candidate.label if best and correct else ""

    def seen(self, yet: bool = True) -> str:
        if not self.label:
            return "none correct yet" if yet else "none correct"
        return f"{self.speedup:.2f}x ({self.label})"

    def evaluated(self, row: Row) -> tuple[str, str, str]:
        """(label, `` {params}``, verdict) of an evaluated row; remembers it if it is the fastest."""
        rec = row.record
        label = row.candidate.label if row.candidate else "(no code)"
        params = f" {row.candidate.params}" if row.candidate and row.candidate.params else ""
        verdict = rec.outcome.value if rec else "?"
        if rec is not None and rec.is_correct and rec.speedup:
            ms = f" {rec.timing.median_ms:.4f} ms" if rec.timing else ""
            verdict = f"{verdict} {rec.speedup:.2f}x{ms}"
        elif rec is not None and not rec.is_correct and rec.message:
            verdict = f"{verdict}: {_first_line(rec.message)}"
        if rec is not None and rec.is_correct and (rec.speedup or 0) > self.speedup:
            self.speedup, self.label = rec.speedup or 0.0, label
        return label, params, verdict + (" (cached)" if rec is not None and rec.cached else "")


def _first_line(message: str, limit: int = 160) -> str:
    """The first non-empty line of a verdict's message, cut to ``limit`` characters (the log line stays one line)."""
    line = next((part.strip() for part in message.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."
