"""The KernelBench table's rows and summary lines (``kernelbench.py``): one markdown row per problem,
then per level the problems recognised and correct, geo-means against eager and torch.compile, the
memory-bound rows at >= 90% of the measured copy rate, and fp32 matmul against cuBLAS."""

from __future__ import annotations

import math
import statistics
from typing import Any

HEADER = [
    "| problem | recipe | ms | x eager | x torch.compile | x naive | roofline share | roofline |",
    "|---|---|---|---|---|---|---|---|",
]
#: the memory-bound bar of the issue: share of the measured copy bandwidth
MEM_BAR = 0.9


def notes(row: dict[str, Any]) -> str:
    """The recipes that were wrong, failed or not measured, for the recipe column."""
    parts = [f"{k}: " + ", ".join(row[k]) for k in ("wrong", "failed", "cut", "slow") if row.get(k)]
    if row.get("float64"):  # off eager by more than 1e-3, within the judge's float64-calibrated bounds
        parts.append("correct against float64, not within 1e-3 of eager: " + ", ".join(row["float64"]))
    if row.get("pressed"):
        parts.append("pressed for time: the top-ranked correct recipe only")
    elif row.get("untimed"):
        parts.append(f"{len(row['untimed'])} more correct, not timed (--top)")
    parts.extend(row.get("rewritten") or [])
    for k in ("compile_error", "compile_note"):
        if row.get(k):
            parts.append(f"torch.compile: {row[k]}")
    return f" ({'; '.join(parts)})" if parts else ""


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and value == value else "-"


def format_row(row: dict[str, Any]) -> str:
    """The row's markdown line (an error or cut row keeps the problem and says why)."""
    if "ms" not in row:
        what = row.get("error") or "cut: " + ", ".join(row.get("cut") or ["not measured"])
        return f"| {row['problem']} | {what}{notes({**row, 'cut': []})} | | | | | | |"
    return (
        f"| {row['problem']} | {row['recipe']}{notes(row)} | {row['ms']:.4f} | {_num(row['x_eager'], '.2f')} | "
        f"{_num(row['x_compile'], '.2f')} | {_num(row['x_naive'], '.2f')} | "
        + (
            "- | rewritten |"  # its own work is not the problem's: a share of the problem's roofline would mislead
            if row.get("rewritten")
            else f"{_num(100 * row['roofline'], '.0f')}% | {row['roof']} |"
        )
    )


def geo(values: list[float]) -> float:
    """Geometric mean of the positive, finite values (nan if none)."""
    good = [v for v in values if v == v and 0 < v < math.inf]
    return math.exp(statistics.fmean(math.log(v) for v in good)) if good else math.nan


def _level(row: dict[str, Any]) -> str:
    return str(row["problem"]).split("/")[0]


def is_fp32_matmul(row: dict[str, Any]) -> bool:
    """A level-1 fp32 matmul whose eager reference is one cuBLAS call (torch.matmul / bmm, TF32 off)."""
    name = str(row["problem"])
    return (
        name.startswith("level1/")
        and "matmul" in name
        and "diag" not in name
        and "triangular" not in name
        and all(str(d).removeprefix("torch.") == "float32" for d in row.get("dtypes", []))
    )


def summary(rows: list[dict[str, Any]], compiled: bool) -> list[str]:
    """The summary lines over ``rows`` (``compiled``: torch.compile was run)."""
    lines: list[str] = []
    levels = sorted({_level(r) for r in rows})
    for scope in [*levels, "all"]:
        mine = [r for r in rows if scope in ("all", _level(r))]
        good = [r for r in mine if "ms" in r]
        recog = sum(1 for r in mine if r.get("recognised"))
        cut = sum(1 for r in mine if "ms" not in r and r.get("cut"))
        comp = geo([r["x_compile"] for r in good]) if compiled else math.nan
        n_comp = sum(1 for r in good if r["x_compile"] == r["x_compile"])
        plain = [r for r in good if not r.get("rewritten")]
        lines.append(
            f"{scope}: {recog}/{len(mine)} recognised, {len(good)}/{len(mine)} correct and timed"
            + (f" ({cut} cut)" if cut else "")
            + f"; geo-mean x eager {_num(geo([r['x_eager'] for r in good]), '.2f')}, "
            f"x torch.compile {_num(comp, '.2f')} (over {n_comp}), x naive {_num(geo([r['x_naive'] for r in good]), '.2f')}"
            + (
                f"; without the {len(good) - len(plain)} algebraically rewritten rows: x torch.compile "
                f"{_num(geo([r['x_compile'] for r in plain]) if compiled else math.nan, '.2f')}"
                if len(plain) < len(good)
                else ""
            )
        )
    for scope in levels:
        mem = [
            r
            for r in rows
            if _level(r) == scope and "ms" in r and r["roof"] == "copy" and not r.get("rewritten")
        ]
        at_bar = [r for r in mem if r["roofline"] >= MEM_BAR]
        both = [r for r in at_bar if r["x_compile"] >= 1.0] if compiled else []
        lines.append(
            f"{scope} memory-bound: {len(at_bar)}/{len(mem)} at >= {100 * MEM_BAR:.0f}% of copy bandwidth"
            + (f", {len(both)}/{len(mem)} also >= 1.0x torch.compile" if compiled else "")
        )
    mm = [r for r in rows if "ms" in r and is_fp32_matmul(r)]
    if mm:
        each = ", ".join(f"{r['problem'].split('/')[1].removesuffix('.py')} {r['x_eager']:.2f}" for r in mm)
        lines.append(
            f"fp32 matmul x cuBLAS (eager torch.matmul, TF32 off): geo-mean "
            f"{geo([r['x_eager'] for r in mm]):.2f} over {len(mm)} ({each})"
        )
    return lines
