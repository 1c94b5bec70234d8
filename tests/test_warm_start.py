"""Warm starts from the performance database: records written, sources read, seeds ranked, and the
tuning stage seeded on PoCL from an earlier ``kf-run tune`` at another shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_helpers import EXAMPLES

from kfoundry.core import warm_start
from kfoundry.core.recorded import CacheWriter
from kfoundry.core.space import ParamSpace
from kfoundry.core.store import Store
from kfoundry.core.warm_start import Context, PerfRecord, WarmStartError

SPACE = ParamSpace({"BLOCK": [32, 64, 128, 256], "VEC": [1, 2, 4]}, restrictions=["BLOCK * VEC <= 512"])
TARGET = Context("k1", "vector_add", "pthread-Xeon", {"N": 4096})


def rec(
    params: dict, ms: float, device: str = "pthread-Xeon", n: int = 4096, kernel: str = "k1"
) -> PerfRecord:
    return PerfRecord(Context(kernel, "vector_add", device, {"N": n}), params, ms, f"{device}/{n}/{kernel}")


def test_nearest_context_ranks_first_and_invalid_configs_are_dropped() -> None:
    records = [
        rec({"BLOCK": 256, "VEC": 1}, 1.0, device="gfx90a"),  # best of another device
        rec({"BLOCK": 256, "VEC": 4}, 0.5, n=65536),  # violates BLOCK * VEC <= 512 here: never seeded
        rec({"BLOCK": 64, "VEC": 4}, 2.0, n=8192),  # best valid one of the nearest shape, same device
        rec({"BLOCK": 32, "VEC": 1}, 6.0, n=8192),
        rec({"BLOCK": 128, "VEC": 2}, 0.1, kernel="other"),  # another kernel: far
        PerfRecord(
            Context("k1", "vector_add", "pthread-Xeon", {"N": 4096}), {"BLOCK": 64}, 0.1, "x"
        ),  # no VEC
    ]
    seeds = warm_start.rank_seeds(records, SPACE, TARGET, 4)
    assert seeds[0] == {"BLOCK": 64, "VEC": 4}
    assert seeds[1] == {"BLOCK": 256, "VEC": 1}  # another device, same shape: next
    assert {"BLOCK": 256, "VEC": 4} not in seeds and len(seeds) == 4
    assert seeds[-1] == {"BLOCK": 32, "VEC": 1} or seeds[-1] == {"BLOCK": 128, "VEC": 2}
    assert warm_start.rank_seeds(records, SPACE, TARGET, 0) == []
    assert warm_start.distance(TARGET, TARGET) == 0
    assert (
        warm_start.distance(Context("k1", "vector_add", "Portable Computing Language: pthread-Xeon"), TARGET)
        < 1.5
    )


def test_sources_run_folders_stores_caches_and_directories(tmp_path: Path) -> None:
    run = tmp_path / "db" / "run_a"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")  # not a cache file: skipped in a directory
    (run / "best.json").write_text('{"speedup": 1}')
    with Store(run / "kfoundry.db") as store:
        warm_start.remember(store, "a", TARGET, "opencl", {"BLOCK": 64, "VEC": 2}, 0.25)
        assert [r.params for r in warm_start.store_records(store)] == [{"BLOCK": 64, "VEC": 2}]
    writer = CacheWriter(
        tmp_path / "db" / "other_host.json",
        device_name="gfx90a",
        kernel_name="vector_add",
        problem_size=[8192],
        tune_params={"BLOCK": [32, 64], "VEC": [1, 2]},
    )
    writer.add({"BLOCK": 32, "VEC": 1}, {"time": 0.5})
    writer.add({"BLOCK": 64, "VEC": 1}, {"time": "CompilationFailedConfig"})
    writer.close()
    records = warm_start.load_sources([tmp_path / "db"])
    assert sorted((r.context.device, r.time_ms) for r in records) == [("gfx90a", 0.5), ("pthread-Xeon", 0.25)]
    cached = next(r for r in records if r.context.device == "gfx90a")
    assert cached.context.shapes == {"0": 8192} and cached.params == {"BLOCK": 32, "VEC": 1}
    assert len(warm_start.load_sources([run])) == 1  # a run folder
    assert len(warm_start.load_sources([run / "kfoundry.db"])) == 1  # a store named directly
    with pytest.raises(WarmStartError, match="no such file"):
        warm_start.load_sources([tmp_path / "missing"])
    with pytest.raises(WarmStartError, match="best.json"):  # a non-cache JSON named directly is refused
        warm_start.load_sources([run / "best.json"])
    (tmp_path / "broken.db").write_text("not sqlite at all, definitely not")
    with pytest.raises(WarmStartError, match="broken.db"):
        warm_start.load_sources([tmp_path / "broken.db"])


def test_kf_run_tune_bad_warm_start_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kfoundry.core.cli import main

    for extra in (
        ["--replay", "benchmarks/spaces/opencl_matmul_pocl.json"],
        [str(EXAMPLES / "native" / "vector_add.toml"), str(EXAMPLES / "native" / "vector_add.cl")],
    ):
        with pytest.raises(SystemExit) as info:
            main(
                [
                    "tune",
                    *extra,
                    "--evaluations",
                    "3",
                    "--warm-start",
                    str(tmp_path / "nope"),
                    "--set",
                    f"output_dir={json.dumps(str(tmp_path))}",
                ]
            )
        assert info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: tuner.warm_start:") and "nope" in err and "\n" not in err


def test_kf_run_tune_logs_each_trial_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from kfoundry.core.cli import main

    with pytest.raises(SystemExit) as info:  # a replay's trials are instant: their lines are debug (-v)
        main(["tune", "--replay", "benchmarks/spaces/opencl_matmul_pocl.json", "--evaluations", "4", "-v"])
    assert info.value.code == 0
    err = capsys.readouterr().err
    assert "replaying opencl_matmul_pocl with bayesian, 4 evaluations" in err
    assert [line.split(": ", 1)[1].split(" {")[0] for line in err.splitlines() if "tune trial" in line] == [
        f"tune trial {i}/4" for i in range(1, 5)
    ]


@pytest.mark.slow
def test_kf_run_tune_is_warm_started_from_an_earlier_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kfoundry.core.cli import main

    def tune(n: int, out: Path, *more: str) -> dict:
        args = [
            "tune",
            str(EXAMPLES / "native" / "vector_add.toml"),
            str(EXAMPLES / "native" / "vector_add.cl"),
            "--shape",
            f"N={n}",
            "--tuner",
            "random",
            "--evaluations",
            "3",
            "--json",
            "--seed",
            str(n),
            "--set",
            f"output_dir={json.dumps(str(out))}",
            "--set",
            "evaluation.target_time_s=0.005",
            "--set",
            "evaluation.warmup_s=0.0",
            "--set",
            "evaluation.rotate_bytes=0",
            "--set",
            "evaluation.trials=2",
            "--set",
            "tuner.warm_seeds=2",
            *more,
        ]
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 0
        captured = capsys.readouterr()
        assert "tune trial 3/3" in captured.err  # a line per trial as it goes (no terminal here)
        return json.loads(captured.out)

    first = tune(4096, tmp_path / "host_a")
    ranked = sorted((t["time_ms"], t["params"]) for t in first["trials"] if t["time_ms"] is not None)
    # another output folder (another machine's runs, copied): warm-started only through --warm-start
    second = tune(8192, tmp_path / "host_b", "--warm-start", str(tmp_path / "host_a"))
    seeded = [t["params"] for t in second["trials"] if t["seeded"]]
    assert ranked[0][1] in seeded  # the best of the earlier shape is among the first tried
