"""Environment faults end in one line naming the path and the cause, exit status 2, and the store's
rows intact: ``output_dir`` that is a file, a full disk, a read-only run folder, unreadable rows, a
missing or emptied store, and a second ``kf-run resume`` of a folder in use.

The full-disk and read-only cases mount a small tmpfs in a private mount namespace (``unshare -m``);
they are skipped where that is not allowed.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kfoundry.core.cli import main
from kfoundry.core.commands.resume import check_resumable
from kfoundry.core.config import load_config
from kfoundry.core.loop import STORE_FILE, LoopState, write_run_file
from kfoundry.core.models import Candidate, EvalRecord, Outcome, TimingStats
from kfoundry.core.search import SearchAsk
from kfoundry.core.store import RunLock, Store, StoreError

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ROOT / "examples/kernelbench/vector_add.py"
RUN_ID = "vector_add-test"


def make_run_folder(folder: Path) -> Path:
    """A run folder as a stopped run leaves it: run.json and a store with rows in every table."""
    folder.mkdir(parents=True, exist_ok=True)
    config = load_config(overrides=[f"output_dir={folder.parent}", "budget.evaluations=1"])
    write_run_file(folder, RUN_ID, PROBLEM, {"N": 1024}, config, None)
    with Store(folder / STORE_FILE) as store:
        store.save_run(RUN_ID, "vector_add", config.model_dump(mode="json"))
        cand = Candidate(source="class ModelNew: pass", generator="offline")
        h = store.save_candidate(cand, run_id=RUN_ID)
        timing = TimingStats(
            median_ms=1.0, iqr_ms=0.1, ci95_low_ms=0.9, ci95_high_ms=1.1, mean_ms=1.0, min_ms=0.9, n=5
        )
        record = EvalRecord(
            candidate_hash=h, eval_key="k", problem="vector_add", backend="opencl", device="d",
            outcome=Outcome.correct, timing=timing, speedup=2.0,
        )  # fmt: skip
        store.save_evaluation(record, run_id=RUN_ID)
        store.execute("INSERT INTO loop_state VALUES (?, ?)", (RUN_ID, LoopState().model_dump_json()))
        store.execute(
            "INSERT INTO loop_proposals (run_id, generation, idx, candidate, ask, generator, record) "
            "VALUES (?,?,?,?,?,?,?)",
            (
                RUN_ID,
                0,
                0,
                cand.model_dump_json(),
                SearchAsk().model_dump_json(),
                "offline",
                record.model_dump_json(),
            ),
        )
    return folder


def dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (read-only), to compare before and after a fault."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        ]
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in tables}
    finally:
        conn.close()


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``kf-run ARGS`` in this process: (exit status, stderr)."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    code = stop.value.code
    return int(code) if isinstance(code, int) else 1, capsys.readouterr().err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_output_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, err = run_cli([str(PROBLEM), "--set", f"output_dir={afile}", "--shape", "N=1024"], capsys)
    line = one_error_line(err)
    assert code == 2 and str(afile) in line and "Not a directory" in line
    assert afile.read_text() == "x"


def test_debug_anywhere_shows_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, err = run_cli([str(PROBLEM), "--set", f"output_dir={afile}", "--debug"], capsys)
    assert code == 2 and "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: ")


def test_second_writer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = make_run_folder(tmp_path / "run")
    before = dump(folder / STORE_FILE)
    lock = RunLock(folder / (STORE_FILE + ".lock"))  # as a first `kf-run resume` holds it
    try:
        code, err = run_cli(["resume", str(folder)], capsys)
    finally:
        lock.release()
    line = one_error_line(err)
    assert code == 2 and "is in use by another kf-run" in line and str(folder) in line
    assert dump(folder / STORE_FILE) == before


def test_unreadable_rows_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = make_run_folder(tmp_path / "run")
    db = folder / STORE_FILE
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE loop_proposals SET ask='{not json'")
    conn.close()
    before = dump(db)
    code, err = run_cli(["resume", str(folder)], capsys)
    line = one_error_line(err)
    assert code == 2 and "loop_proposals row (generation 0, index 0), column ask is unreadable" in line
    assert str(db) in line and dump(db) == before


@pytest.mark.parametrize("fault", ["missing", "empty", "replaced"])
def test_missing_or_emptied_store_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str
) -> None:
    folder = make_run_folder(tmp_path / "run")
    db = folder / STORE_FILE
    if fault == "missing":
        db.unlink()
    elif fault == "empty":
        db.write_bytes(b"")
    else:  # a fresh store in its place: no record of this run
        db.unlink()
        Store(db).close()
    code, err = run_cli(["resume", str(folder)], capsys)
    line = one_error_line(err)
    assert code == 2 and "--start-over" in line and str(folder) in line
    assert not db.is_file() or fault != "missing"  # refusing created nothing
    check_resumable(folder, RUN_ID, start_over=True)  # asked to start over: allowed


def test_start_over_does_not_excuse_damage(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run")
    conn = sqlite3.connect(folder / STORE_FILE)
    with conn:
        conn.execute("UPDATE evaluations SET record='[]'")
    conn.close()
    with pytest.raises(StoreError, match=r"evaluations row 1 is unreadable"):
        check_resumable(folder, RUN_ID, start_over=True)


# -- faults of the file system: a small tmpfs in a private mount namespace -----------------------

_FS_SCRIPT = textwrap.dedent(
    """
    import json, os, shutil, subprocess, sys
    from pathlib import Path
    from kfoundry.core.cli import main

    mount, template, fault = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    run = mount / "run"
    shutil.copytree(template, run)
    if fault == "full":
        with open(mount / "filler", "wb") as fh:
            try:
                while True:
                    fh.write(b"\\0" * 65536)
                    fh.flush()
            except OSError:
                pass
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    try:
        main(["resume", str(run)])
        code = 0
    except SystemExit as exc:
        code = exc.code
    print(json.dumps({"code": code}))
    """
)


def _fs_fault(
    tmp_path: Path, fault: str
) -> tuple[int, str, dict[str, list[tuple[Any, ...]]], dict[str, Any]]:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    template = make_run_folder(tmp_path / "template")
    before = dump(template / STORE_FILE)
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = tmp_path / "fault.py"
    script.write_text(_FS_SCRIPT)
    # the run is copied into the tmpfs, faulted, resumed; the store is then read back from the tmpfs
    shell = (
        f"{sys.executable} {script} {mount} {template} {fault}; "
        f"rm -f {mount}/filler; mount -o remount,rw {mount}; "
        f'{sys.executable} -c \'import json, sys; sys.path.insert(0, "{ROOT / "tests"}"); '
        f'from test_hardening_env import dump; print(json.dumps(dump(__import__("pathlib").Path("{mount}/run/{STORE_FILE}"))))\''
    )
    proc = subprocess.run(["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=300)
    out = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(out) == 2, proc.stdout + proc.stderr
    result, after = json.loads(out[0]), json.loads(out[1])
    return int(result["code"]), proc.stderr, after, {k: [list(r) for r in v] for k, v in before.items()}


@pytest.mark.parametrize(("fault", "cause"), [("full", "the disk is full"), ("readonly", "read-only")])
def test_full_disk_and_read_only_folder(tmp_path: Path, fault: str, cause: str) -> None:
    code, err, after, before = _fs_fault(tmp_path, fault)
    line = one_error_line(err)
    assert code == 2 and cause in line and "/run/" in line, err
    assert after == before  # nothing stored was lost


def test_huge_shape_ends_in_one_line_without_allocating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kf-run vector_add.py --shape N=274877906944`` (2 TiB of inputs): refused before any input is drawn."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, err = run_cli(
        [str(PROBLEM), "--shape", "N=274877906944", "--set", f"output_dir={tmp_path}"], capsys
    )
    line = one_error_line(err)
    assert code == 2 and "one call's inputs take 2.0 TiB (N=274877906944), more than" in line
    # KiB; imports and the OpenCL runtime take a few hundred MiB the first time, no input was drawn
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1024 * 1024
