"""Peak memory bandwidth and fp32 rate per device: a datasheet table, measurement, and the roofline.

Measured peaks (``kf-run devices --measure``: a large device-to-device copy counting bytes read plus
written, and a large fp32 matrix product with TF32 off) are stored per device in a JSON file
(``$KF_PEAKS_FILE``, default ``~/.cache/kfoundry/peaks.json``) and win over the table.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.models import DeviceProfile

#: (pattern on the device name, datasheet bandwidth GB/s, datasheet fp32 GFLOP/s); first match wins.
PEAK_TABLE: list[tuple[str, float, float]] = [
    (r"H200 NVL", 4800, 60000),
    (r"H200", 4800, 67000),
    (r"GH200", 4000, 67000),
    (r"H100 PCIe", 2000, 51000),
    (r"H100 NVL", 3900, 60000),
    (r"H100", 3350, 67000),
    (r"H800", 3350, 67000),
    (r"B200", 8000, 80000),
    (r"A100.*80GB.*PCIe", 1935, 19500),
    (r"A100.*SXM4?-80GB|A100 80GB", 2039, 19500),
    (r"A100", 1555, 19500),
    (r"A800", 2039, 19500),
    (r"L40S", 864, 91600),
    (r"L40", 864, 90500),
    (r"L4\b", 300, 30300),
    (r"A10G|A10\b", 600, 31200),
    (r"V100", 900, 15700),
    (r"T4\b", 320, 8100),
    (r"RTX 6000 Ada", 960, 91100),
    (r"RTX A6000", 768, 38700),
    (r"RTX 4090", 1008, 82600),
    (r"RTX 3090", 936, 35600),
    (r"MI300X", 5300, 163400),
    (r"MI250X", 3277, 47900),
    (r"MI210", 1638, 22600),
    (r"Data Center GPU Max 1550", 3277, 52000),
    (r"Arc\(TM\) A770|Arc A770", 560, 19660),
]


class MeasuredPeaks(BaseModel):
    """Peaks measured on one device."""

    bandwidth_gbs: float
    gflops: float
    copy_bytes: int
    matmul_n: int
    measured_at: str
    method: str = "torch copy_ (bytes read + written) and fp32 mm with TF32 off; median of repeats (CUDA events on GPUs)"


def table_peaks(name: str) -> tuple[float, float] | None:
    """Datasheet (bandwidth GB/s, fp32 GFLOP/s) for a device name, or None if unknown."""
    for pattern, bandwidth, gflops in PEAK_TABLE:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return bandwidth, gflops
    return None


def peaks_file() -> Path:
    """Where measured peaks are stored."""
    explicit = os.environ.get("KF_PEAKS_FILE")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kfoundry" / "peaks.json"


def load_measured() -> dict[str, MeasuredPeaks]:
    """Every stored measurement, by device key (an unreadable file counts as empty)."""
    path = peaks_file()
    try:
        raw = json.loads(path.read_text())
        return {key: MeasuredPeaks.model_validate(value) for key, value in raw.items()}
    except (OSError, ValueError):
        return {}


def store_measured(profile: DeviceProfile, peaks: MeasuredPeaks) -> Path:
    """Store a measurement for ``profile``'s device; returns the file written."""
    data = {key: value.model_dump() for key, value in load_measured().items()}
    data[profile.key] = peaks.model_dump()
    path = peaks_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


def with_peaks(profile: DeviceProfile) -> DeviceProfile:
    """``profile`` with peak rates filled in: measured where stored, else from the table."""
    measured = load_measured().get(profile.key)
    if measured is not None:
        return profile.model_copy(
            update={
                "peak_bandwidth_gbs": measured.bandwidth_gbs,
                "peak_gflops": measured.gflops,
                "peaks_measured": True,
            }
        )
    if profile.peak_bandwidth_gbs is not None and profile.peak_gflops is not None:
        return profile
    found = table_peaks(profile.name)
    if found is None:
        return profile
    return profile.model_copy(
        update={
            "peak_bandwidth_gbs": profile.peak_bandwidth_gbs or found[0],
            "peak_gflops": profile.peak_gflops or found[1],
        }
    )


def roofline_time_s(profile: DeviceProfile, bytes_moved: float | None, flops: float | None) -> float | None:
    """The speed-of-light time: the larger of bytes over bandwidth and FLOPs over the fp32 peak."""
    bounds = []
    if bytes_moved and profile.peak_bandwidth_gbs:
        bounds.append(bytes_moved / (profile.peak_bandwidth_gbs * 1e9))
    if flops and profile.peak_gflops:
        bounds.append(flops / (profile.peak_gflops * 1e9))
    return max(bounds) if bounds else None


def roofline_fraction(
    profile: DeviceProfile, time_s: float, bytes_moved: float | None, flops: float | None
) -> float | None:
    """Share of the speed of light reached (1.0 = at the roofline; above 1 is suspicious)."""
    bound = roofline_time_s(profile, bytes_moved, flops)
    return bound / time_s if bound and time_s > 0 else None


def _median_time_s(fn: object, repeats: int, sync: object, on_gpu: bool = False) -> float:
    """Median seconds per call: CUDA events on a GPU (launch overhead excluded), else the host clock."""
    import torch

    times = []
    for _ in range(repeats):
        sync()  # type: ignore[operator]
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()  # type: ignore[operator]
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
            continue
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        sync()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _copy_time_s(device: Any, copy_bytes: int, repeats: int, sync: object, on_gpu: bool) -> float:
    import torch

    src = torch.empty(copy_bytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    return _median_time_s(lambda: dst.copy_(src), repeats, sync, on_gpu)


def measure_peaks(
    torch_device: str, *, copy_bytes: int | None = None, matmul_n: int | None = None
) -> MeasuredPeaks:
    """Measure copy bandwidth and the fp32 matrix-product rate on a torch device (``cuda:0``, ``cpu``)."""
    import torch

    device = torch.device(torch_device)
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise BackendUnavailable("cannot measure peaks: PyTorch sees no CUDA device here")
    copy_bytes = copy_bytes or (2 << 30 if on_gpu else 256 << 20)
    matmul_n = matmul_n or (8192 if on_gpu else 1024)

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    if on_gpu:  # events are recorded on the current device's stream
        torch.cuda.set_device(device)
    copy_s = _copy_time_s(device, copy_bytes, 20 if on_gpu else 5, sync, on_gpu)
    old_tf32 = torch.backends.cuda.matmul.allow_tf32 if on_gpu else False
    old_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.rand(matmul_n, matmul_n, device=device)
        b = torch.rand(matmul_n, matmul_n, device=device)
        for _ in range(2):
            torch.mm(a, b)
        mm_s = _median_time_s(lambda: torch.mm(a, b), 10 if on_gpu else 3, sync, on_gpu)
    finally:
        torch.set_float32_matmul_precision(old_precision)
        if on_gpu:
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return MeasuredPeaks(
        bandwidth_gbs=round(2 * copy_bytes / copy_s / 1e9, 1),
        gflops=round(2 * matmul_n**3 / mm_s / 1e9, 1),
        copy_bytes=copy_bytes,
        matmul_n=matmul_n,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
