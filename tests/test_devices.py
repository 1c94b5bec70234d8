"""``kf-run devices``, the peak table, stored measurements and the roofline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kfoundry.core.commands.devices import command
from kfoundry.core.models import DeviceProfile
from kfoundry.core.peaks import (
    MeasuredPeaks,
    load_measured,
    measure_peaks,
    roofline_fraction,
    roofline_time_s,
    store_measured,
    table_peaks,
    with_peaks,
)


@pytest.fixture(autouse=True)
def peaks_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "peaks.json"
    monkeypatch.setenv("KF_PEAKS_FILE", str(path))
    return path


def test_table_matches_device_names() -> None:
    assert table_peaks("NVIDIA H200") == (4800, 67000)
    assert table_peaks("NVIDIA H100 PCIe") == (2000, 51000)
    assert table_peaks("NVIDIA H100 80GB HBM3") == (3350, 67000)
    assert table_peaks("NVIDIA A100-SXM4-80GB") == (2039, 19500)
    assert table_peaks("Tesla T4") == (320, 8100)
    assert table_peaks("pthread-AMD EPYC 7763") is None


def test_measured_peaks_win_over_the_table(peaks_file: Path) -> None:
    h200 = DeviceProfile(backend="cuda", name="NVIDIA H200")
    assert with_peaks(h200).peak_bandwidth_gbs == 4800 and not with_peaks(h200).peaks_measured
    peaks = MeasuredPeaks(bandwidth_gbs=4300.0, gflops=51000.0, copy_bytes=1, matmul_n=1, measured_at="now")
    assert store_measured(h200, peaks) == peaks_file
    filled = with_peaks(h200)
    assert (filled.peak_bandwidth_gbs, filled.peak_gflops, filled.peaks_measured) == (4300.0, 51000.0, True)
    assert list(load_measured()) == ["cuda:NVIDIA H200"]


def test_roofline_takes_the_larger_bound() -> None:
    dev = DeviceProfile(backend="cuda", name="x", peak_bandwidth_gbs=1000.0, peak_gflops=10000.0)
    assert roofline_time_s(dev, 1e9, 1e9) == pytest.approx(1e-3)  # memory-bound: 1 ms vs 0.1 ms
    assert roofline_time_s(dev, 1e6, 1e12) == pytest.approx(0.1)  # compute-bound
    assert roofline_fraction(dev, 2e-3, 1e9, None) == pytest.approx(0.5)
    assert roofline_time_s(DeviceProfile(backend="cuda", name="y"), 1e9, 1e9) is None


def test_measure_on_the_host_is_real_and_positive() -> None:
    peaks = measure_peaks("cpu", copy_bytes=16 << 20, matmul_n=256)
    assert peaks.bandwidth_gbs > 0.1 and peaks.gflops > 0.1
    assert peaks.copy_bytes == 16 << 20


def test_devices_command_json_lists_every_backend(kf_plugin_manager) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(command, ["--json"])
    assert result.exit_code == 0, result.output
    listing = {entry["backend"]: entry for entry in json.loads(result.output)["backends"]}
    assert set(listing) == set(kf_plugin_manager.registry("backend").names())
    cuda = listing["cuda"]
    assert cuda["capabilities"]["can_compile"] in (True, False)
    if not cuda["capabilities"]["can_run"]:
        assert cuda["capabilities"]["reason"]
    for entry in listing.values():
        for device in entry["devices"]:
            assert device["backend"] == entry["backend"] and device["name"]


def test_devices_command_table(kf_plugin_manager) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(command, [])
    assert result.exit_code == 0, result.output
    assert "cuda" in result.output
