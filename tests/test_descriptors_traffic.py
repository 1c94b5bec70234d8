"""The ncu traffic pass: the CSV parser on a hand-written sample, the features, the sandboxed pass
end to end with a stand-in for ncu (no GPU here), and the fallback lines."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from kfoundry.core.behaviour.axes import resolve
from kfoundry.core.behaviour.profiling import profiler_for_run, with_traffic
from kfoundry.core.behaviour.traffic import (
    NcuOutputError,
    apply_traffic,
    measured_hierarchy,
    out_of_bounds,
    parse_ncu_csv,
    traffic_features,
)
from kfoundry.core.evaluation.profile import find_ncu, interpret, ncu_command
from kfoundry.core.models import Candidate, EvalRecord, Outcome

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "ncu_details_handwritten.csv"  # written by hand in ncu's documented CSV layout
FAKE_NCU = DATA / "fake_ncu.sh"
ROOT = Path(__file__).resolve().parents[1]


def test_parser_sums_launches_and_reads_units() -> None:
    metrics, launches = parse_ncu_csv(SAMPLE.read_text())
    assert launches == 2
    assert metrics["dram__bytes_read.sum"] == pytest.approx(2_162_688 + 1_050_620)  # "1,050.62" Kbyte
    assert metrics["dram__bytes_write.sum"] == pytest.approx(1_048_576 + 1_050_000)  # "1.05" Mbyte
    assert metrics["gpu__time_duration.sum"] == pytest.approx(41_312 + 3_100)  # ns + us
    # an average is averaged over launches, not summed; "n/a" is left out
    assert metrics["sm__warps_active.avg.pct_of_peak_sustained_active"] == pytest.approx(75.0)
    assert metrics["sm__sass_thread_inst_executed_op_hfma_pred_on.sum"] == 0


def test_parser_refuses_text_without_a_table() -> None:
    with pytest.raises(NcuOutputError, match="no CSV header"):
        parse_ncu_csv("==PROF== Connected to process 1\n==ERROR== something\n")
    with pytest.raises(NcuOutputError, match="lacks"):
        parse_ncu_csv('"ID","Kernel Name"\n"0","k"\n')


def test_features_from_the_sample() -> None:
    metrics, _ = parse_ncu_csv(SAMPLE.read_text())
    feats = traffic_features(metrics)
    dram = 2_162_688 + 1_050_620 + 1_048_576 + 1_050_000
    flops = 2 * 134_217_728 + 262_144
    assert feats["dram_bytes"] == pytest.approx(dram)
    assert feats["counted_flops"] == pytest.approx(flops)
    assert feats["measured_intensity"] == pytest.approx(flops / dram)
    assert feats["l2_reuse"] == pytest.approx((69_206_016 + 2_101_248) / dram)
    assert feats["achieved_occupancy"] == pytest.approx(0.75)
    # no counted FLOPs (tensor cores): the problem's own FLOPs over the kernel's DRAM bytes
    tensor = traffic_features({"dram__bytes_read.sum": 100.0}, problem_flops=1000.0)
    assert tensor["measured_intensity"] == pytest.approx(10.0)


def test_traffic_drives_intensity_and_hierarchy() -> None:
    streaming = {"l2_reuse": 1.1, "measured_intensity": 0.2}
    cached = {"l2_reuse": 20.0, "measured_intensity": 5.0}
    assert measured_hierarchy(1.0, streaming) == 0  # wide loads, but the bytes come from DRAM
    assert measured_hierarchy(0.0, cached) == 1  # served by L2
    assert measured_hierarchy(2.0, streaming) == 2  # on-chip exchange comes from the compiled code
    feats = apply_traffic({"intensity": 40.0, "hierarchy": 1.0, "mix": 1.0}, streaming)
    assert (feats["intensity"], feats["hierarchy"], feats["mix"]) == (0.2, 0.0, 1.0)
    assert (feats["static_intensity"], feats["static_hierarchy"]) == (40.0, 1.0)


def test_refusal_and_failures_are_one_line() -> None:
    refused = interpret(
        {"rc": 1, "csv": "", "output": "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission..."}
    )
    assert refused.warning is not None and "ERR_NVGPUCTRPERM" in refused.warning and not refused.metrics
    assert "\n" not in refused.warning
    broken = interpret({"rc": 9, "csv": "", "output": "==ERROR== Failed to connect\n"})
    assert broken.warning == "profile: ncu reported no metrics: ==ERROR== Failed to connect"
    assert (
        interpret({"error": "timed out after 5 s (killed)"}).warning
        == "profile: timed out after 5 s (killed)"
    )
    forged = interpret(
        {"rc": 0, "csv": '"ID","Metric Name","Metric Unit","Metric Value"\n"0","x","byte","-5"\n'}
    )
    assert forged.warning is not None  # a negative count is not a measurement


def test_find_ncu_and_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_NCU", str(FAKE_NCU))
    assert find_ncu() == str(FAKE_NCU)
    monkeypatch.setenv("KF_NCU", "/nonexistent/ncu")
    assert find_ncu() is None
    cmd = ncu_command("ncu", "/scratch/ncu.csv", ["python", "-m", "t"])
    assert cmd[:2] == ["ncu", "--csv"] and cmd[-3:] == ["python", "-m", "t"]
    assert "dram__bytes_read.sum" in cmd[cmd.index("--metrics") + 1]


def test_pass_is_off_unless_measured_traffic_axes_on_cuda() -> None:
    class Opts:
        profile = "auto"

    class Strategy:
        options = Opts()

    class Backend:
        name = "opencl"

    class Ev:
        backend = Backend()

        def _job(self, kind: str, candidate: Candidate) -> None: ...

    assert profiler_for_run(Strategy(), resolve("measured"), Ev(), None) is None  # auto, not cuda
    Backend.name = "cuda"
    assert profiler_for_run(Strategy(), resolve("measured"), Ev(), None) is not None
    assert profiler_for_run(Strategy(), resolve("static"), Ev(), None) is None
    assert profiler_for_run(Strategy(), resolve(["mix", "occupancy"]), Ev(), None) is None
    Opts.profile = "off"
    assert profiler_for_run(Strategy(), resolve("measured"), Ev(), None) is None


def _pocl_evaluator(tmp: Path):  # noqa: ANN202
    from kfoundry.core.config import load_config
    from kfoundry.core.evaluation import Evaluator
    from kfoundry.core.problem import load_problem
    from kfoundry.core.store import Store

    config = load_config(overrides=["backend.name=opencl", f"output_dir={tmp}"])
    problem = load_problem(ROOT / "examples/kernelbench/matmul.py")
    evaluator = Evaluator(problem, config, Store(tmp / "store.db"), "traffic-test")
    seed = ROOT / "examples/kernelbench/seeds/matmul_opencl.py"
    return evaluator, Candidate(source=seed.read_text(), language="opencl")


@pytest.mark.skipif(not os.access(FAKE_NCU, os.X_OK), reason="the stand-in ncu is not executable")
def test_sandboxed_pass_end_to_end(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The real confined server and child, the real target on PoCL; only ncu itself is a stand-in. It
    writes the uid it ran as into the log: never root (when this test runs as root)."""
    pytest.importorskip("pyopencl")
    from kfoundry.core.evaluation import profile

    monkeypatch.setenv("KF_NCU", str(FAKE_NCU))
    tmp_path.chmod(0o755)
    evaluator, candidate = _pocl_evaluator(tmp_path)
    first_lines: list[str] = []
    original = profile.interpret

    def spy(answer: dict) -> profile.ProfileResult:
        first_lines.append(str(answer.get("csv", "")).splitlines()[0])
        return original(answer)

    monkeypatch.setattr(profile, "interpret", spy)
    result = profile.profile_candidate(evaluator._job("evaluate", candidate), timeout_s=90)
    assert result.warning is None, result.warning
    assert result.launches == 2 and result.metrics["lts__t_bytes.sum"] > 0
    assert first_lines and "forward done" in first_lines[0], first_lines
    if os.geteuid() == 0:
        assert "uid=0 " not in first_lines[0]

    # the loop's side on that answer (the pass itself is not run twice)
    monkeypatch.setattr(profile, "profile_candidate", lambda job, timeout_s=45.0: result)

    class Opts:
        profile = "on"

    class Strategy:
        options = Opts()

    profiler = profiler_for_run(Strategy(), resolve("measured"), evaluator, evaluator.problem)
    record = EvalRecord(
        candidate_hash="h", eval_key="k", problem="p", backend="opencl", device="d", outcome=Outcome.correct
    )
    feats = with_traffic(profiler, candidate, record, {"intensity": 50.0, "hierarchy": 2.0})
    assert feats is not None and feats["hierarchy"] == 2.0 and feats["traffic_measured"] == 1.0
    assert feats["intensity"] == pytest.approx(feats["measured_intensity"])


def test_bounds_from_what_the_judge_knows() -> None:
    metrics, _ = parse_ncu_csv(SAMPLE.read_text())
    honest = traffic_features(metrics)
    h200 = {"peak_bandwidth_gbs": 4800.0, "peak_gflops": 60_000.0}
    # 2 MiB of inputs, 0.2 ms per call: the sample's traffic fits
    assert out_of_bounds(honest, input_bytes=2 * 1024 * 1024, time_s=2e-4, **h200) is None
    # a forged "everything came from the caches": DRAM reads below the inputs' bytes
    cached = {**honest, "dram_read_bytes": 1000.0, "dram_bytes": 2000.0}
    assert "below 0.9x the inputs" in str(
        out_of_bounds(cached, input_bytes=2 * 1024 * 1024, time_s=2e-4, **h200)
    )
    # more bytes or FLOPs than the device can move or count in the judge's own time
    assert "dram_bytes" in str(out_of_bounds(honest, input_bytes=None, time_s=1e-7, **h200))
    flops = {**honest, "dram_bytes": 0.0, "l2_bytes": 0.0, "l1_bytes": 0.0}
    assert "FLOPs exceed" in str(out_of_bounds(flops, input_bytes=None, time_s=1e-7, **h200))


FORGER = """
import os, time
FORGED = open("/work/main/tests/data/ncu_details_handwritten.csv").read().replace("2,162,688", "1")
if os.fork() == 0:  # a daemon that waits for the profiler's log and rewrites it
    os.setsid()
    for _ in range(600):
        time.sleep(0.01)
        try:
            text = open("/scratch/ncu.csv").read()
        except OSError:
            continue
        if "fake ncu" in text:
            open("/scratch/ncu.csv", "w").write(FORGED)
            break
    time.sleep(5)
    os._exit(0)
"""


def test_a_candidate_that_rewrites_the_log_does_not_move_its_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its daemon outlives ncu: the pass refuses the log (one line), the static estimates stand."""
    pytest.importorskip("pyopencl")
    monkeypatch.setenv("KF_NCU", str(FAKE_NCU))
    with tempfile.TemporaryDirectory() as tmp:
        evaluator, honest = _pocl_evaluator(Path(tmp))
        forger = Candidate(source=FORGER.replace("/work/main", str(ROOT)) + honest.source, language="opencl")
        profiler = profiler_for_run(
            type("S", (), {"options": type("O", (), {"profile": "on"})()})(),
            resolve("measured"),
            evaluator,
            evaluator.problem,
        )
        record = EvalRecord(
            candidate_hash="h",
            eval_key="k",
            problem="p",
            backend="opencl",
            device="d",
            outcome=Outcome.correct,
        )
        assert with_traffic(profiler, forger, record, {"intensity": 50.0, "hierarchy": 2.0}) is None
        assert profiler is not None and "outlived ncu" in str(profiler.warning)
        assert "outlived ncu" in record.log and "\n" not in str(profiler.warning)


def test_only_a_record_that_would_enter_the_archive_is_profiled() -> None:
    from kfoundry.core.archive import Archive
    from kfoundry.core.behaviour.profiling import _would_enter
    from kfoundry.core.models import TimingStats

    axes = resolve("measured")
    archive = Archive((4, 4, 4, 4), islands=2)
    feats = {"intensity": 2.0, "hierarchy": 2.0, "mix": 1.0, "occupancy": 1.0}
    coords = tuple(a.level(feats[a.name]) for a in axes)

    def rec(speedup: float) -> EvalRecord:
        timing = TimingStats(
            median_ms=1.0, iqr_ms=0.0, ci95_low_ms=1.0, ci95_high_ms=1.0, mean_ms=1.0, min_ms=1.0, n=1
        )
        return EvalRecord(
            candidate_hash=str(speedup),
            eval_key="k",
            problem="p",
            backend="b",
            device="d",
            outcome=Outcome.correct,
            speedup=speedup,
            timing=timing,
        )

    cand = Candidate(source="x", language="cuda")
    assert _would_enter(archive, axes, rec(1.0), feats)  # empty cell
    archive.insert(cand, rec(2.0), coords, island=0)
    assert _would_enter(archive, axes, rec(1.0), feats)  # island 1 is still empty there
    archive.insert(cand, rec(2.0), coords, island=1)
    assert not _would_enter(archive, axes, rec(1.0), feats)  # worse than both elites
    assert _would_enter(archive, axes, rec(3.0), feats)
    assert _would_enter(None, axes, rec(1.0), feats)  # a strategy without an archive: always
