"""Achieved traffic of a kernel from Nsight Compute (``ncu --csv``): the parser and the features.

``ncu --csv --page details --print-units base --metrics ...`` prints one row per (kernel launch,
metric) with the columns ``ID``, ``Kernel Name``, ``Metric Name``, ``Metric Unit``, ``Metric Value``
(values may carry thousands separators). :func:`parse_ncu_csv` sums every metric over the launches it
lists; :func:`traffic_features` turns the sums into the features the measured axes read:

- ``dram_bytes``, ``l2_bytes``, ``l1_bytes``: bytes moved at each level (DRAM read + write, L2 slices,
  L1/TEX), summed over the candidate's launches in one call of its ``forward``;
- ``counted_flops``: fp32/fp64/fp16 adds and multiplies, two per fused multiply-add (thread level);
- ``l2_reuse``: L2 bytes per DRAM byte (data served by the cache instead of memory), ``l1_reuse`` the same for L1;
- ``achieved_occupancy``: active warps over the maximum (0-1), averaged over launches;
- ``measured_intensity``: counted FLOPs (the problem's own where the counters see none, as for
  tensor-core work) per DRAM byte: the kernel's own traffic.

The numbers come from a process the candidate shares (see ``kfoundry/core/evaluation/profile.py``):
they place a kernel in the archive and never decide a verdict or a time, and :func:`out_of_bounds`
refuses traffic that the judge's own time and the problem's inputs rule out.
"""

from __future__ import annotations

import csv
import io
import math

#: What the profiling pass asks ncu for.
NCU_METRICS: tuple[str, ...] = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "l1tex__t_bytes.sum",
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_dadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_dmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_dfma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hfma_pred_on.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "gpu__time_duration.sum",
)

_UNIT = {
    "": 1.0,
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "nsecond": 1.0,
    "usecond": 1e3,
    "msecond": 1e6,
    "second": 1e9,
    "inst": 1.0,
    "%": 1.0,
}

_MAX_BYTES = 1 << 22


class NcuOutputError(ValueError):
    """ncu's output holds no metric table (one line: what was expected)."""


def parse_ncu_csv(text: str) -> tuple[dict[str, float], int]:
    """The metrics of every launch in ``text`` (ncu's CSV details page), summed, and the launch count.

    Averages (``.avg``, ``.pct``) are averaged over launches instead. Lines before the header (``==PROF==``
    messages) are skipped; a value that is not a finite number ("n/a") is left out.
    """
    lines = text[:_MAX_BYTES].splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise NcuOutputError('ncu output: no CSV header line starting with "ID" (run with --csv)')
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    needed = {"ID", "Metric Name", "Metric Unit", "Metric Value"}
    if not needed <= set(reader.fieldnames or ()):
        raise NcuOutputError(
            f"ncu output: the CSV header lacks {sorted(needed - set(reader.fieldnames or ()))}"
        )
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    launches: set[str] = set()
    for row in reader:
        name, unit, raw = row.get("Metric Name"), row.get("Metric Unit") or "", row.get("Metric Value")
        if not name or raw is None:
            continue
        try:
            value = float(raw.replace(",", "")) * _UNIT.get(unit.strip().lower(), 1.0)
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0:
            continue
        launches.add(str(row.get("ID")))
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    for name in sums:
        if ".avg" in name or ".pct" in name:
            sums[name] /= counts[name]
    if not sums:
        raise NcuOutputError("ncu output: the CSV holds no metric values")
    return sums, len(launches)


def traffic_features(metrics: dict[str, float], problem_flops: float | None = None) -> dict[str, float]:
    """The traffic features (see the module docstring) of summed ncu ``metrics``."""

    def m(name: str) -> float:
        return metrics.get(name, 0.0)

    def op(kind: str) -> float:
        return m(f"sm__sass_thread_inst_executed_op_{kind}_pred_on.sum")

    flops = sum(op(p + "add") + op(p + "mul") + 2 * op(p + "fma") for p in ("f", "d", "h"))
    dram = m("dram__bytes_read.sum") + m("dram__bytes_write.sum")
    l2, l1 = m("lts__t_bytes.sum"), m("l1tex__t_bytes.sum")
    work = flops if flops > 0 else float(problem_flops or 0.0)
    floor = max(dram, 1.0)
    out = {
        "dram_bytes": dram,
        "dram_read_bytes": m("dram__bytes_read.sum"),
        "l2_bytes": l2,
        "l1_bytes": l1,
        "counted_flops": flops,
        "l2_reuse": l2 / floor,
        "l1_reuse": l1 / floor,
        "measured_intensity": work / floor,
        "traffic_measured": 1.0,
    }
    if "sm__warps_active.avg.pct_of_peak_sustained_active" in metrics:
        out["achieved_occupancy"] = min(1.0, m("sm__warps_active.avg.pct_of_peak_sustained_active") / 100.0)
    if "gpu__time_duration.sum" in metrics:
        out["profiled_ns"] = m("gpu__time_duration.sum")
    return out


#: Slack on the physical bounds (:func:`out_of_bounds`): an honest kernel is inside them with room to spare.
READ_FLOOR = 0.9
RATE_CEILING = 1.5
#: The caches' rates as multiples of the DRAM peak, generous ceilings (H200: L2 about 2-3x, L1 about 7x).
L2_RATE = 10.0
L1_RATE = 30.0


def out_of_bounds(
    traffic: dict[str, float],
    *,
    input_bytes: float | None,
    time_s: float | None,
    peak_bandwidth_gbs: float | None,
    peak_gflops: float | None,
) -> str | None:
    """Why ``traffic`` cannot be what the kernel did, from what the judge knows itself (None: it can).

    ncu flushes the caches before each replay, so every input byte comes from DRAM at least once:
    DRAM reads >= :data:`READ_FLOOR` x the inputs. In the judge's own time per call a kernel moves at
    most :data:`RATE_CEILING` x the peak bandwidth through DRAM (L2 and L1: :data:`L2_RATE`,
    :data:`L1_RATE` times that) and counts at most that factor x the peak FLOP rate.
    """
    read = traffic.get("dram_read_bytes", 0.0)
    if input_bytes and read < READ_FLOOR * input_bytes:
        return f"DRAM reads {read:.3g} B are below {READ_FLOOR:g}x the inputs' {input_bytes:.3g} B"
    if time_s and time_s > 0 and peak_bandwidth_gbs:
        bw = RATE_CEILING * peak_bandwidth_gbs * 1e9 * time_s
        for key, factor in (("dram_bytes", 1.0), ("l2_bytes", L2_RATE), ("l1_bytes", L1_RATE)):
            if traffic.get(key, 0.0) > factor * bw:
                return (
                    f"{key} {traffic[key]:.3g} B exceed {factor * RATE_CEILING:g}x the peak bandwidth over "
                    f"the judge's {time_s * 1e3:.3g} ms"
                )
    if time_s and time_s > 0 and peak_gflops:
        top = RATE_CEILING * peak_gflops * 1e9 * time_s
        if traffic.get("counted_flops", 0.0) > top:
            return f"{traffic['counted_flops']:.3g} FLOPs exceed {RATE_CEILING:g}x the peak rate over the judge's time"
    return None


#: L2 bytes per DRAM byte from which a kernel counts as served by the caches (hierarchy level 1).
CACHE_REUSE = 2.0


def measured_hierarchy(static_level: float, traffic: dict[str, float]) -> float:
    """The hierarchy level with measured traffic: on-chip exchange (levels 2-3, from the compiled code)
    stays; below it, level 1 means the caches serve the kernel (L2 reuse >= :data:`CACHE_REUSE`), 0 that
    its traffic goes to DRAM."""
    if static_level >= 2:
        return static_level
    return 1.0 if traffic.get("l2_reuse", 0.0) >= CACHE_REUSE else 0.0


def apply_traffic(features: dict[str, float], traffic: dict[str, float]) -> dict[str, float]:
    """``features`` with the measured traffic driving the intensity and hierarchy axes."""
    out = {**features, **traffic}
    out["static_intensity"] = features.get("intensity", 0.0)
    out["static_hierarchy"] = features.get("hierarchy", 0.0)
    out["intensity"] = traffic["measured_intensity"]
    out["hierarchy"] = measured_hierarchy(features.get("hierarchy", 0.0), traffic)
    return out
