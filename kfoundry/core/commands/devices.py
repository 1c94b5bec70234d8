"""``kf-run devices``: every device every backend can see, with its profile and peak rates."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kfoundry.core.backend import Backend
from kfoundry.core.models import DeviceProfile
from kfoundry.core.peaks import measure_peaks, store_measured, with_peaks
from kfoundry.core.plugins import get_plugin_manager


def _torch_device_for(backend: Backend, device: DeviceProfile) -> str | None:
    """The torch device whose copy and matmul measure ``device``'s peaks, or None if none does."""
    if backend.torch_device.startswith("cuda"):
        return f"cuda:{device.index}"
    if backend.torch_device == "cpu" and device.device_type == "cpu":
        return "cpu"
    return None


def devices_listing(measure: bool = False) -> list[dict[str, Any]]:
    """One entry per backend: its capabilities, its devices (profiles) and any error, as plain data."""
    out: list[dict[str, Any]] = []
    for spec in get_plugin_manager().registry("backend"):
        entry: dict[str, Any] = {"backend": spec.name, "package": spec.package, "devices": [], "notes": []}
        try:
            backend = spec.build()
            caps = backend.capabilities()
            entry["capabilities"] = caps.model_dump()
            profiles = backend.devices()
        except Exception as exc:  # one broken backend must not hide the others
            entry["error"] = f"{type(exc).__name__}: {exc}"
            out.append(entry)
            continue
        for profile in profiles:
            if measure:
                profile = _measure(backend, profile, caps.can_run, entry["notes"])
            entry["devices"].append(profile.model_dump(mode="json"))
        out.append(entry)
    return out


def _measure(backend: Backend, profile: DeviceProfile, can_run: bool, notes: list[str]) -> DeviceProfile:
    torch_device = _torch_device_for(backend, profile)
    if not can_run or torch_device is None:
        notes.append(f"{profile.name}: peaks not measured (no way to run on it from here)")
        return profile
    peaks = measure_peaks(torch_device)
    path = store_measured(profile, peaks)
    notes.append(
        f"{profile.name}: measured {peaks.bandwidth_gbs} GB/s, {peaks.gflops} GFLOP/s (stored in {path})"
    )
    return with_peaks(profile)


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.1f} GiB" if value else "-"


def _kib(value: int | None) -> str:
    return f"{value // 1024} KiB" if value else "-"


def _render(listing: list[dict[str, Any]]) -> None:
    console = Console()
    table = Table(title="kfoundry devices")
    for col in (
        "backend",
        "#",
        "device",
        "type",
        "units",
        "CC",
        "memory",
        "L2",
        "shared/local",
        "GB/s",
        "GFLOP/s",
        "peaks",
    ):
        table.add_column(col)
    for entry in listing:
        for d in entry["devices"]:
            table.add_row(
                entry["backend"],
                str(d["index"]),
                d["name"],
                d["device_type"],
                str(d.get("compute_units") or "-"),
                d.get("compute_capability") or "-",
                _gib(d.get("global_mem_bytes")),
                f"{(d.get('l2_cache_bytes') or 0) / 2**20:.0f} MiB" if d.get("l2_cache_bytes") else "-",
                _kib(d.get("shared_mem_per_block") or d.get("local_mem_bytes")),
                f"{d['peak_bandwidth_gbs']:.0f}" if d.get("peak_bandwidth_gbs") else "-",
                f"{d['peak_gflops']:.0f}" if d.get("peak_gflops") else "-",
                "measured" if d.get("peaks_measured") else ("table" if d.get("peak_gflops") else "-"),
            )
    if table.row_count:
        console.print(table)
    for entry in listing:
        if not entry["devices"]:
            why = entry.get("error") or entry.get("capabilities", {}).get("reason") or "none visible"
            console.print(f"{entry['backend']}: no device ({why})")
        for note in entry["notes"]:
            console.print(f"{entry['backend']}: {note}")


@click.command(
    "devices",
    epilog="\b\nExamples:\n  kf-run devices\n  kf-run devices --measure\n  kf-run devices --json",
)
@click.option(
    "--measure", is_flag=True, help="Measure copy bandwidth and fp32 matmul rate; store them per device."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (full profiles) instead of a table.")
def command(measure: bool, as_json: bool) -> None:
    """List every device every backend can see, with its profile and peak rates."""
    listing = devices_listing(measure=measure)
    if as_json:
        click.echo(json.dumps({"backends": listing}, indent=2))
    else:
        _render(listing)
