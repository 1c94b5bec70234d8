"""Recorded spaces: Kernel Tuner cache files (read, write, resume), replay, T4 export, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kfoundry.core.cli import main
from kfoundry.core.recorded import (
    CacheWriter,
    RecordedSpace,
    RecordError,
    export_t4,
    replay_objective,
    t4_results,
)
from kfoundry.core.tuner import Budget, Measurement, run_tuner

SPACES = Path(__file__).resolve().parent.parent / "benchmarks" / "spaces"

# A cache file as Kernel Tuner writes it (cut off mid-recording: no closing braces, trailing comma).
KT_CACHE = """{
"device_name": "NVIDIA A100-PCIE-40GB",
"kernel_name": "vector_add",
"problem_size": [1000000],
"tune_params_keys": ["block_size_x", "tile"],
"tune_params": {"block_size_x": [64, 128, 256, 1024], "tile": [1, 2]},
"objective": "time",
"cache": {
"64,1": {"block_size_x": 64, "tile": 1, "time": 0.5, "times": [0.5, 0.51, 0.49], "compile_time": 300.1,
 "verification_time": 0, "benchmark_time": 2.1, "strategy_time": 0, "framework_time": 0.3, "timestamp": "x"},
"64,2": {"block_size_x": 64, "tile": 2, "time": 0.4, "times": [0.4, 0.4, 0.4], "compile_time": 310.0,
 "verification_time": 0, "benchmark_time": 2.0, "strategy_time": 0, "framework_time": 0.3, "timestamp": "x"},
"128,1": {"block_size_x": 128, "tile": 1, "time": 0.3, "times": [0.3, 0.31, 0.29], "compile_time": 299.0,
 "verification_time": 0, "benchmark_time": 2.0, "strategy_time": 0, "framework_time": 0.3, "timestamp": "x"},
"128,2": {"block_size_x": 128, "tile": 2, "time": "CompilationFailedConfig", "compile_time": 12.0,
 "verification_time": 0, "benchmark_time": 0, "strategy_time": 0, "framework_time": 0.3, "timestamp": "x"},
"256,1": {"block_size_x": 256, "tile": 1, "time": 0.35, "times": [0.35, 0.35], "compile_time": 301.0,
 "verification_time": 0, "benchmark_time": 2.0, "strategy_time": 0, "framework_time": 0.3, "timestamp": "x"},
"1024,2": {"block_size_x": 1024, "tile": 2, "time": "RuntimeFailedConfig", "compile_time": 280.0,
 "verification_time": 0, "benchmark_time": 0, "strategy_time": 0, "framework_time": 0.3, "timestamp": "x"},"""


@pytest.fixture
def kt_file(tmp_path: Path) -> Path:
    path = tmp_path / "vector_add_A100.json"
    path.write_text(KT_CACHE)
    return path


def test_reads_a_kernel_tuner_cache_file_cut_off_mid_recording(kt_file: Path) -> None:
    rec = RecordedSpace.load(kt_file)
    assert rec.device_name == "NVIDIA A100-PCIE-40GB" and rec.keys_order == ["block_size_x", "tile"]
    assert rec.values[(64, 1)] == 0.5 and rec.values[(128, 2)] is None and rec.values[(1024, 2)] is None
    assert rec.optimum == 0.3
    # the replayed space is the recorded configurations that did not fail (Kernel Tuner's definition)
    assert rec.space().keys == [(64, 1), (64, 2), (128, 1), (256, 1)]
    failed = rec.measure({"block_size_x": 128, "tile": 2})
    assert not failed.valid and failed.invalidity == "compile"
    assert rec.measure({"block_size_x": 64, "tile": 1}).times == [0.5, 0.51, 0.49]


def test_closed_file_and_kernel_tuner_agree(kt_file: Path) -> None:
    util = pytest.importorskip("kernel_tuner.util")
    kt_file.write_text(KT_CACHE.rstrip(",") + "}\n}")
    ours = RecordedSpace.load(kt_file)
    theirs = util.read_cache(str(kt_file), open_cache=False)
    valid = {k for k, e in theirs["cache"].items() if "__error__" not in e}
    assert {",".join(map(str, k)) for k in ours.valid_keys} == valid


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not a Kernel Tuner cache file"),
        ('{"cache": {}}', "no 'tune_params_keys'"),
        ("[1]", "not a Kernel Tuner cache file"),
    ],
)
def test_malformed_cache_file_is_a_one_line_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(RecordError, match=message):
        RecordedSpace.load(path)
    with pytest.raises(RecordError, match="not found"):
        RecordedSpace.load(tmp_path / "missing.json")


def test_writer_appends_resumes_and_kernel_tuner_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    params = {"BLOCK": [32, 64, 128], "VEC": [1, 4]}
    kwargs = {"device_name": "pocl", "kernel_name": "k", "problem_size": [4096], "tune_params": params}
    writer = CacheWriter(path, **kwargs)  # type: ignore[arg-type]
    writer.add_measurement({"BLOCK": 32, "VEC": 1}, Measurement(2.0, times=[2.0, 2.1], compile_time_ms=5.0))
    writer.add_measurement({"BLOCK": 64, "VEC": 4}, Measurement(None, "compile", "error"))
    # killed here: no close. A new writer resumes from what is on disk.
    again = CacheWriter(path, **kwargs)  # type: ignore[arg-type]
    assert again.has({"BLOCK": 32, "VEC": 1}) and not again.has({"BLOCK": 128, "VEC": 1})
    again.add_measurement({"BLOCK": 128, "VEC": 1}, Measurement(1.5, times=[1.5]))
    again.close()
    data = json.loads(path.read_text())
    assert data["cache"]["64,4"]["time"] == "CompilationFailedConfig"
    rec = RecordedSpace.load(path)
    assert rec.optimum == 1.5 and len(rec.entries) == 3
    util = pytest.importorskip("kernel_tuner.util")
    assert set(util.read_cache(str(path), open_cache=False)["cache"]) == {"32,1", "64,4", "128,1"}


def test_t4_export_follows_the_schema(kt_file: Path, tmp_path: Path) -> None:
    rec = RecordedSpace.load(kt_file)
    from kfoundry.plugins.tuners.random_tuner import RandomTuner

    trace = run_tuner(rec.space(), replay_objective(rec), RandomTuner(), Budget(evaluations=3), seed=0)
    out = export_t4(tmp_path / "t4.json", trace.trials, rec.tune_params)
    data = json.loads(out.read_text())
    assert data["schema_version"] == "1.0.0" and len(data["results"]) == 3
    first = data["results"][0]
    assert set(first["configuration"]) == {"block_size_x", "tile"}
    assert first["invalidity"] == "correct" and first["measurements"][0]["name"] == "time"
    bad = t4_results(
        [trace.trials[0].__class__(0, {"block_size_x": 64, "tile": 1}, Measurement(None, "runtime"), 0.0)],
        rec.tune_params,
    )
    assert bad["results"][0]["invalidity"] == "runtime" and bad["results"][0]["measurements"] == []
    jsonschema = pytest.importorskip("jsonschema")
    file_utils = pytest.importorskip("kernel_tuner.file_utils")
    _, schema = file_utils.output_file_schema("results")
    jsonschema.validate(data, schema)
    jsonschema.validate(bad, schema)


def test_replay_is_deterministic_per_seed(kf_plugin_manager: object) -> None:
    from kfoundry.core.config import TunerConfig, build_plugin

    path = sorted(SPACES.glob("*.json"))[0]
    rec = RecordedSpace.load(path)

    def replay(name: str, seed: int) -> list[tuple[object, ...]]:
        tuner = build_plugin(TunerConfig(name=name), "tuner", kf_plugin_manager)  # type: ignore[arg-type]
        trace = run_tuner(rec.space(), replay_objective(rec), tuner, Budget(evaluations=15), seed=seed)
        return [tuple(t.config.values()) + (t.value,) for t in trace.trials]

    for name in ("bayesian", "nevergrad", "random"):
        assert replay(name, 7) == replay(name, 7)
        assert replay(name, 7) != replay(name, 8)


def test_bundled_recorded_spaces_are_real_and_large() -> None:
    paths = sorted(SPACES.glob("*.json"))
    assert paths, "benchmarks/spaces/ holds no recorded space"
    for path in paths:
        rec = RecordedSpace.load(path)
        assert len(rec.valid_keys) >= 200, rec.describe()
        assert all(isinstance(rec.entries[k].get("times"), list) for k in rec.valid_keys)
        assert rec.space().size == len(rec.valid_keys)


def test_cli_replay_and_t4(kt_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t4 = tmp_path / "out" / "t4.json"
    with pytest.raises(SystemExit) as info:
        main(
            [
                "tune",
                "--replay",
                str(kt_file),
                "--tuner",
                "bayesian",
                "--evaluations",
                "4",
                "--t4",
                str(t4),
                "--json",
            ]
        )
    assert info.value.code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["evaluations"] == 4 and result["best_time_ms"] == 0.3  # all four valid configs seen
    assert len(json.loads(t4.read_text())["results"]) == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tune", "--replay", "missing.json"], "recorded space not found"),
        (["tune", "--replay", "{kt}", "--tuner", "nope"], "unknown tuner plugin 'nope'"),
        (["tune", "--replay", "{kt}", "--set", 'tuner.options.engine="svm"'], "tuner.options.engine"),
        (["tune", "examples/kernelbench/matmul.py"], "needs PROBLEM and CANDIDATE"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    kt_file: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([a.replace("{kt}", str(kt_file)) for a in args])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
