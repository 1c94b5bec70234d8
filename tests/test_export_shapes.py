"""A three-shape softmax run on PoCL, end to end (slow): the exported table picks the fastest kernel per
shape, the package matches the reference in a fresh process on every shape (and on one the run did
not cover, through the fallback), and the report renders in headless Chromium with every chart drawn."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kfoundry
from kfoundry.api import OptimizeResult

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[1]
SOFTMAX = ROOT / "examples" / "kernelbench" / "softmax.py"
CLI = "import sys; from kfoundry.core.cli import main; sys.exit(main(sys.argv[1:]))"
FAST = [
    "evaluation.trials=2",
    "evaluation.target_time_s=0.02",
    "evaluation.warmup_s=0.0",
    "evaluation.min_repeats=3",
    "evaluation.max_repeats=10",
    "evaluation.rotate_bytes=0",
    "evaluation.timeout_s=60",
    "evaluation.correctness_budget_s=0.0",
    "evaluation.shape_variants=0",
    "budget.proposals_per_generation=2",
    "tuner.every=0",
    "tuner.elites=1",
    "tuner.evaluations=3",
]
SHAPE_SETS = [{"batch_size": 4, "dim": 32}, {"batch_size": 64, "dim": 256}, {"batch_size": 8, "dim": 2048}]


def kf_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> OptimizeResult:
    out = tmp_path_factory.mktemp("runs")
    return kfoundry.optimize(SOFTMAX, generations=1, overrides=FAST, output_dir=out, shape_sets=SHAPE_SETS)


def test_the_table_takes_the_fastest_kernel_of_each_shape(run: OptimizeResult, tmp_path: Path) -> None:
    assert run.best is not None and len(run.best_per_shape) == 3
    done = kf_run("export", str(run.run_dir), "--to", str(tmp_path / "softmax3"), "--json")
    assert done.returncode == 0, done.stderr
    table = json.loads((tmp_path / "softmax3" / "table.json").read_text())["entries"]
    perf = json.loads((tmp_path / "softmax3" / "perf.json").read_text())["kernels"]
    assert [e["shapes"] for e in table] == SHAPE_SETS
    winners = []
    for i, entry in enumerate(table):
        timed = [
            (k["per_shape"][i]["median_ms"], k["candidate_id"], k["params"])
            for k in perf
            if k["per_shape"][i]["outcome"] == "correct"
        ]
        ms, cid, params = min(timed, key=lambda t: t[0])
        assert entry["candidate_id"] == cid and entry["median_ms"] == ms
        winners.append(cid)
    # entries differ exactly where the fastest kernel differs
    assert len({e["candidate_id"] for e in table}) == len(set(winners))
    text = (run.run_dir / "report.html").read_text()
    assert all(f"batch_size={s['batch_size']}, dim={s['dim']}" in text for s in SHAPE_SETS)


def test_exported_package_matches_the_reference_in_a_fresh_process(
    run: OptimizeResult, tmp_path: Path
) -> None:
    # 30 fresh-input checks per entry: a kernel that fails now and then here is left out, not shipped
    done = kf_run(
        "export",
        str(run.run_dir),
        "--to",
        str(tmp_path / "softmax_kernels"),
        "--header",
        "--json",
        "--verify",
        "30",
    )
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    table = json.loads((tmp_path / "softmax_kernels" / "table.json").read_text())
    kept = [e["input_shapes"] for e in table["entries"]]
    left_out = [e["input_shapes"] for e in table["rejected"]]
    # every shape set is either dispatched or left out with the reason said (the export-time check failed)
    assert sorted(kept + left_out) == sorted([[[4, 32]], [[64, 256]], [[8, 2048]]])
    assert info["entries"] == len(kept) >= 1 and len(info["rejected"]) == len(left_out)
    assert info["header"].endswith("softmax.h")
    perf = json.loads((tmp_path / "softmax_kernels" / "perf.json").read_text())
    assert perf["kernels"] and all(len(k["per_shape"]) == 3 for k in perf["kernels"])
    header = (tmp_path / "softmax_kernels" / "softmax.h").read_text()
    assert "#if defined(TARGET_OPENCL_" in header and "KF_KERNEL" in header
    check = textwrap.dedent("""
        import json, warnings, torch
        import softmax_kernels as k
        out = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for b, d in [(4, 32), (64, 256), (3, 100), (8, 2048), (16, 513)]:
                x = torch.rand(b, d)
                y = k.Kernel()(x) if b == 64 else k.softmax(x)
                out.append([b, d, bool(torch.allclose(y, torch.softmax(x, 1), atol=1e-5)), k.dispatcher.last_choice])
            z = k.softmax(torch.rand(4, 32, dtype=torch.float64))
            out.append(["f64", 0, z.dtype == torch.float64, k.dispatcher.last_choice])
        print(json.dumps({"calls": out, "warnings": [str(w.message) for w in caught]}))
    """)
    fresh = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    result = json.loads(fresh.stdout.strip().splitlines()[-1])
    calls = result["calls"]
    assert all(c[2] for c in calls), calls  # every shape matches the reference, the uncovered ones too
    from kfoundry.core.report.dispatch import covers

    ranges = [e.get("input_ranges") for e in table["entries"]]
    for b, d, _, choice in calls[:5]:  # exact shapes, and shape ranges where a kernel proved shape-generic
        covered = [[b, d]] in kept or any(covers(r, [[b, d]]) for r in ranges)
        assert choice.startswith("kernel:") if covered else choice.startswith("reference: "), (b, d, choice)
    assert calls[2][3] == "reference: no kernel for input shapes [[3, 100]]"  # below every range
    assert calls[5][3].startswith("reference: no kernel for dtypes ['float64']")
    # the run's kernels take their sizes from the inputs: at least one covers the range between the sets
    assert any(r == [[[4, 64], [7, 2048]]] for r in ranges), ranges
    uncovered = [(b, d) for b, d, _, c in calls[:5] if c.startswith("reference")]
    misses = 1 + len(uncovered)
    assert len(result["warnings"]) == misses  # one per kind of miss, never silent


def _chromium() -> str | None:
    return (
        shutil.which("chromedriver") if shutil.which("chromium") or shutil.which("chromium-browser") else None
    )


def test_report_renders_in_headless_chromium(run: OptimizeResult, tmp_path: Path) -> None:
    driver_path = _chromium()
    if driver_path is None:
        pytest.skip(
            "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        )
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install selenium)"
    )
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1300,2400",
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ):  # offline: any network fetch would fail
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        assert run.report is not None
        driver.get(run.report.as_uri())
        drawn = driver.execute_script("""
            const charts = Array.from(document.querySelectorAll('.kf-chart'));
            return [charts.length, charts.filter(c => c.querySelector('svg.main-svg')).length,
                    document.querySelectorAll('pre.source').length, document.body.innerText];
        """)
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        driver.quit()
    charts, with_svg, sources, text = drawn
    assert errors == []
    assert (
        charts >= 8 and with_svg == charts
    )  # every chart drawn: progress, 3 heatmaps, lineage, roofline, ...
    assert sources >= 1 and run.best is not None and run.best.label in text
    assert "Per-shape results" in text and "batch_size=64, dim=256" in text
    keep = os.environ.get("KF_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
