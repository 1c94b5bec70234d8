"""Every loader answers any input with a value or the project's own one-line error, quickly and in
bounded memory: property-based tests (hypothesis) over config TOML, ``--set``, mutated KernelBench
files, native tasks, model replies, Kernel Tuner caches and stored runs.

Each loader has a default test (a few hundred examples) and a ``slow`` one (10,000). Every example
must end in a value or a typed error (:class:`KfError`, or the reply parser's :class:`ParseFailure`)
whose message is one line, within 1 s of CPU time (5 s of wall time), and the test process's peak RSS
may not grow past a bound.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import resource
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kfoundry.core.commands.resume import check_resumable
from kfoundry.core.config import load_config
from kfoundry.core.errors import KfError
from kfoundry.core.llm.parsing import ParsedReply, ParseFailure, parse_reply
from kfoundry.core.loop import STORE_FILE, LoopState
from kfoundry.core.models import Candidate, EvalRecord, Outcome, TimingStats
from kfoundry.core.problem import load_problem
from kfoundry.core.recorded import RecordedSpace
from kfoundry.core.search import SearchAsk
from kfoundry.core.store import Store

ROOT = Path(__file__).resolve().parent.parent
TYPED = (KfError, ParseFailure)
#: Problems may take at most this much for one call's inputs and outputs in these tests.
LIMIT = 16 * 2**20
#: Slowest allowed example; most one example may raise the process's peak RSS by, and one whole test
#: (hypothesis itself keeps a few hundred MiB over 10,000 examples).
MAX_SECONDS = 1.0  # of CPU time: on a shared machine, wall time also counts other processes' turns
MAX_WALL_SECONDS = 5.0  # a hang (waiting, not computing) still fails
MAX_EXAMPLE_RSS = 256 * 2**20
MAX_RSS_GROWTH = 1024 * 2**20

_common = {
    "deadline": None,  # timed below, per example, after warm-up
    "database": None,
    "suppress_health_check": list(HealthCheck),
}
FAST = settings(max_examples=200, **_common)  # type: ignore[arg-type]
SLOW = settings(max_examples=10_000, **_common)  # type: ignore[arg-type]


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.fixture(autouse=True)
def rss_bound() -> Iterator[None]:
    """No test here may raise the process's peak RSS by more than MAX_RSS_GROWTH."""
    before = _peak_rss()
    yield
    grown = _peak_rss() - before
    assert grown <= MAX_RSS_GROWTH, f"peak RSS grew by {grown >> 20} MiB"


def typed(fn: Callable[[], Any]) -> Any:
    """Run one example: a value or a one-line typed error, within MAX_SECONDS; anything else fails."""
    collecting = gc.isenabled()
    gc.disable()  # a collection of hypothesis's and earlier examples' garbage is not this loader's time
    start, cpu, peak = time.perf_counter(), time.process_time(), _peak_rss()
    try:
        return fn()
    except TYPED as exc:
        message = str(exc)
        assert message and "\n" not in message, f"not one line: {message!r}"
        return exc
    finally:
        took, busy, grown = time.perf_counter() - start, time.process_time() - cpu, _peak_rss() - peak
        if collecting:
            gc.enable()
        assert busy <= MAX_SECONDS, f"example took {busy:.2f} s of CPU time"
        assert took <= MAX_WALL_SECONDS, f"example took {took:.2f} s"
        assert grown <= MAX_EXAMPLE_RSS, f"example raised the peak RSS by {grown >> 20} MiB"


_WORK = Path(tempfile.mkdtemp(prefix="kf-hardening-"))


def _scratch(name: str) -> Path:
    path = _WORK / name
    path.mkdir(exist_ok=True)
    return path


# -- config: TOML documents and --set ------------------------------------------------------------

_SECTIONS = ["problem", "backend", "llms", "ensemble", "search", "tuner", "executor", "budget", "evaluation"]
_FIELDS = [
    "name",
    "options",
    "generations",
    "proposals_per_generation",
    "shapes",
    "max_bytes",
    "mode",
    "weight",
    "model",
    "device",
    "trials",
    "timeout_s",
    "every",
    "output_dir",
    "seed",
    "path",
]
_KEYS = st.sampled_from(_SECTIONS + _FIELDS + ["0", "1", "²", "9" * 5000, "", " ", "a.b"]) | st.text(
    max_size=8
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()
    | st.text(max_size=30)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)
_TOML_TOKENS = st.sampled_from(
    [
        "[budget]",
        "[[llms]]",
        "[evaluation]",
        "[problem.shapes]",
        "generations = ",
        "name = ",
        "llms = ",
        "budget = ",
        "budget.generations = ",
        "'x'",
        '"offline"',
        "1",
        "-1",
        "1e309",
        "inf",
        "nan",
        "0x7f",
        "9" * 5000,
        "[",
        "]",
        "{",
        "}",
        "=",
        ",",
        "\n",
        ".",
        "'''",
        '"""',
        "\\u0000",
        "[" * 3000,
        "{a=" * 2000,
        "1979-05-27T07:32:00Z",
        "true",
        "# c",
    ]
)
_TOML = st.lists(_TOML_TOKENS | st.text(max_size=10), max_size=30).map("".join)


def check_config_data(data: dict[str, Any]) -> None:
    typed(lambda: load_config(data=data))


def check_config_toml(text: str) -> None:
    path = _scratch("config") / "kf.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    typed(lambda: load_config(path))


_SET_KEYS = st.lists(_KEYS, min_size=0, max_size=4).map(".".join)
_SET_VALUES = st.sampled_from(
    ["1", "2", "-1", "1e999", "[1,2", "{a=1}", '"x"\nb=2', "'offline'", "[[[[", "x" * 3000, "{", "true", ""]
) | st.text(max_size=20)
_SETS = st.lists(st.tuples(_SET_KEYS, _SET_VALUES).map("=".join) | st.text(max_size=20), max_size=5)


def check_config_sets(overrides: list[str]) -> None:
    typed(lambda: load_config(overrides=overrides))


@FAST
@given(st.dictionaries(_KEYS, _VALUES, max_size=6))
def test_config_data(data: dict[str, Any]) -> None:
    check_config_data(data)


@FAST
@given(_TOML)
def test_config_toml(text: str) -> None:
    check_config_toml(text)


@FAST
@given(_SETS)
def test_config_sets(overrides: list[str]) -> None:
    check_config_sets(overrides)


@pytest.mark.slow
@SLOW
@given(st.dictionaries(_KEYS, _VALUES, max_size=6), _TOML, _SETS)
def test_config_10k(data: dict[str, Any], text: str, overrides: list[str]) -> None:
    check_config_data(data)
    check_config_toml(text)
    check_config_sets(overrides)


def test_set_through_a_value_is_one_line() -> None:
    with pytest.raises(KfError, match="'budget' holds a value"):
        load_config(overrides=["budget=1", "budget.generations=2"])


# -- the reply parser ----------------------------------------------------------------------------

_PARENT = (ROOT / "examples/kernelbench/seeds/softmax_opencl.py").read_text()
_REPLY_TOKENS = st.sampled_from(
    [
        "<<<<<<< SEARCH\n",
        "=======\n",
        ">>>>>>> REPLACE\n",
        "```python\n",
        "```\n",
        "```opencl\n",
        "class ModelNew(nn.Module):\n",
        "    pass\n",
        "PARAMS = {'BLOCK': 64}\n",
        "\n",
        "  ",
        "x = (",
        ")" * 100,
        "\x00",
        "import torch\n",
        _PARENT[:200],
        _PARENT[200:600],
        "TUNABLE = {'B': [1, 2]}\n",
    ]
)
_MARKERS = st.sampled_from(
    ["<<<<<<< SEARCH\n", "=======\n", ">>>>>>> REPLACE\n", "```py\n", "```\n", "(", "\n"]
)
_REPLY = st.lists(  # runs of one marker (up to ~50 KB) are what made the old regular expressions backtrack
    _REPLY_TOKENS
    | st.text(max_size=20)
    | st.tuples(_MARKERS, st.integers(1, 3000)).map(lambda t: t[0] * t[1]),
    max_size=25,
).map("".join)


def check_reply(text: str, kind: str, with_parent: bool) -> None:
    result = typed(lambda: parse_reply(text, kind, _PARENT if with_parent else None))  # type: ignore[arg-type]
    assert isinstance(result, ParsedReply | ParseFailure)


@FAST
@given(_REPLY, st.sampled_from(["kernelbench", "native"]), st.booleans())
def test_reply_parser(text: str, kind: str, with_parent: bool) -> None:
    check_reply(text, kind, with_parent)


@pytest.mark.slow
@SLOW
@given(_REPLY, st.sampled_from(["kernelbench", "native"]), st.booleans())
def test_reply_parser_10k(text: str, kind: str, with_parent: bool) -> None:
    check_reply(text, kind, with_parent)


def test_reply_parser_is_linear_on_the_backtracking_reply() -> None:
    """The reply that took 10-65 s (repeated SEARCH/divider lines, 11 KB) and one 100x larger."""
    for repeat in (500, 40_000):
        typed(lambda r=repeat: parse_reply("<<<<<<< SEARCH\n=======\n" * r, "kernelbench", _PARENT))  # type: ignore[misc]
        typed(lambda r=repeat: parse_reply("```py\n" * r + "<<<<<<< SEARCH\n" * r, "native", _PARENT))  # type: ignore[misc]


# -- KernelBench problem files, mutated ----------------------------------------------------------

_KB_SOURCES = [p.read_text() for p in sorted((ROOT / "examples/kernelbench").glob("*.py"))] + [
    p.read_text() for p in sorted((ROOT / "tests/data/hardening").glob("*.py"))
]
_SNIPPETS = [
    "raise SystemExit(3)",
    "N = -1",
    "import os",
    "x = 1 <<",
    "def get_inputs(): return 5",
    "Model = 3",
    "bias_shape = (N, 1)",
    "batch_size = 2**40",
    "dim = 1 << 10**12",
    "features = 0",
    "get_inputs = None",
    "def get_inputs():\n    return get_inputs()",
    "class Model(nn.Module):\n    pass",
    "out_channels = 'x'",
    "raise MemoryError",
    "N = float('nan')",
    "import sys; sys.exit()",
]
_NUMBERS = st.sampled_from([0, 1, -1, 2, 3, 7, 2**31, 2**38, 2**40, 10**30, 10**5000, 4096]) | st.floats(
    allow_nan=True, allow_infinity=True
)
_SHAPE_NAMES = st.sampled_from(
    ["N", "M", "K", "batch_size", "dim", "features", "out_channels", "dim1", "height", "seq_len", "nope", ""]
)


@st.composite
def mutated_kernelbench(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    lines = draw(st.sampled_from(_KB_SOURCES)).split("\n")
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["delete", "duplicate", "number", "insert", "chars", "truncate"]))
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        if op == "delete" and lines:
            del lines[i]
        elif op == "duplicate" and lines:
            lines.insert(i, lines[i])
        elif op == "number" and lines:
            numbers = list(re.finditer(r"\b\d+\b", lines[i]))
            if numbers:
                m = draw(st.sampled_from(numbers))
                value = draw(_NUMBERS)
                text = "1" + "0" * 5000 if value == 10**5000 else repr(value)  # repr refuses 5000 digits
                lines[i] = lines[i][: m.start()] + text + lines[i][m.end() :]
        elif op == "insert":
            lines.insert(i, draw(st.sampled_from(_SNIPPETS)))
        elif op == "chars" and lines:
            lines[i] = lines[i] + draw(st.text(max_size=5))
        elif op == "truncate":
            lines = lines[:i]
    shapes = draw(st.dictionaries(_SHAPE_NAMES, _NUMBERS, max_size=2))
    return "\n".join(lines), shapes


def check_kernelbench(case: tuple[str, dict[str, Any]]) -> None:
    source, shapes = case
    path = _scratch("kernelbench") / "mutated.py"
    path.write_text(source, encoding="utf-8", errors="surrogatepass")

    def load() -> Any:
        problem = load_problem(path, shapes)
        problem.check_size(LIMIT)
        return problem.summary()

    typed(load)


@pytest.fixture(scope="module", autouse=True)
def warm_up() -> None:
    """Not the loaders' time: the plugins' first load, torch's first meta-device convolution (seconds)."""
    load_config()
    for p in sorted((ROOT / "examples/kernelbench").glob("*.py")):
        load_problem(p).analysis()


@FAST
@given(mutated_kernelbench())
def test_kernelbench_files(case: tuple[str, dict[str, Any]]) -> None:
    check_kernelbench(case)


@pytest.mark.slow
@SLOW
@given(mutated_kernelbench())
def test_kernelbench_files_10k(case: tuple[str, dict[str, Any]]) -> None:
    check_kernelbench(case)


def test_huge_shape_is_refused_without_allocating() -> None:
    before = _peak_rss()
    problem = load_problem(ROOT / "examples/kernelbench/vector_add.py", {"N": 274877906944})
    with pytest.raises(KfError, match=r"inputs take 2\.0 TiB \(N=274877906944\), more than the limit"):
        problem.check_size(LIMIT)
    assert _peak_rss() - before < 64 * 2**20


def test_overrides_recompute_derived_constants() -> None:
    problem = load_problem(ROOT / "tests/data/hardening/bias_add.py", {"out_channels": 3})
    assert problem.module.bias_shape == (3, 1, 1)  # type: ignore[union-attr]
    assert problem.analysis().output_shapes == [[2, 3, 4, 4]]
    problem = load_problem(ROOT / "tests/data/hardening/layer_norm_features.py", {"features": 5})
    assert problem.module.normalized_shape == (5, 8) and problem.analysis().output_shapes == [[4, 5, 8]]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "shapes", "message"),
    [
        ("loop_bound.py", {"N": 4}, "cannot set N: it is not set by plain `N = ...` lines"),
        ("bias_add.py", {"out_channels": 2.5}, "cannot set out_channels=2.5: out_channels is an integer"),
        ("bias_add.py", {"bias": 2}, r"unknown shape constant 'bias' \(known: batch_size"),
        ("bias_add.py", {"out_channels": -1}, "the reference failed at batch_size=2, out_channels=-1"),
    ],
)
def test_refused_override_names_the_constant(name: str, shapes: dict[str, Any], message: str) -> None:
    with pytest.raises(KfError, match=message):
        load_problem(ROOT / "tests/data/hardening" / name, shapes).analysis()


# -- native tasks, mutated -----------------------------------------------------------------------

_NATIVE = ROOT / "examples/native"
_NATIVE_SOURCES = [p.read_text() for p in sorted(_NATIVE.glob("*.toml"))]
_TOML_VALUES = st.sampled_from(
    [
        '"N * N"',
        '"10**10**10"',
        '"2 ** 200"',
        '"ceil_div(N, 0)"',
        "\"__import__('os')\"",
        "-5",
        "0",
        "1.5",
        '"nope"',
        "274877906944",
        '"float64"',
        '"bogus_dtype"',
        "[]",
        '"randint"',
        "nan",
        '"N"',
    ]
)


@st.composite
def mutated_native(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    lines = draw(st.sampled_from(_NATIVE_SOURCES)).split("\n")
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["delete", "duplicate", "value", "chars"]))
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        if not lines:
            break
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "value" and "=" in lines[i]:
            lines[i] = lines[i].split("=", 1)[0] + "= " + draw(_TOML_VALUES)
        elif op == "chars":
            lines[i] = lines[i] + draw(st.text(max_size=5))
    shapes = draw(
        st.dictionaries(st.sampled_from(["N", "M", "K", "ROWS", "COLS", "nope"]), _NUMBERS, max_size=2)
    )
    return "\n".join(lines), shapes


def check_native(case: tuple[str, dict[str, Any]]) -> None:
    text, shapes = case
    folder = _scratch("native")
    for f in _NATIVE.iterdir():
        if f.suffix != ".toml" and not (folder / f.name).exists():
            shutil.copy(f, folder / f.name)
    path = folder / "mutated.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")

    def load() -> Any:
        problem = load_problem(path, shapes)
        problem.check_size(LIMIT)
        return problem.make_inputs(0)

    typed(load)


@FAST
@given(mutated_native())
def test_native_tasks(case: tuple[str, dict[str, Any]]) -> None:
    check_native(case)


@pytest.mark.slow
@SLOW
@given(mutated_native())
def test_native_tasks_10k(case: tuple[str, dict[str, Any]]) -> None:
    check_native(case)


# -- Kernel Tuner cache files --------------------------------------------------------------------


def _cache_base() -> dict[str, Any]:
    entry = {
        "compile_time": 1.0,
        "verification_time": 0,
        "benchmark_time": 1.0,
        "strategy_time": 0,
        "framework_time": 0,
        "timestamp": "x",
    }
    cache = {
        f"{b},{t}": {"block_size_x": b, "tile": t, "time": 0.1 * b * t, "times": [0.1 * b * t] * 3, **entry}
        for b in (64, 128)
        for t in (1, 2)
    }
    cache["128,2"]["time"] = "CompilationFailedConfig"
    return {
        "device_name": "A100",
        "kernel_name": "k",
        "problem_size": [1024],
        "tune_params_keys": ["block_size_x", "tile"],
        "tune_params": {"block_size_x": [64, 128], "tile": [1, 2]},
        "objective": "time",
        "cache": cache,
    }


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
_FIELD_PATHS = st.sampled_from(
    [
        ("tune_params_keys",),
        ("tune_params",),
        ("tune_params", "tile"),
        ("cache",),
        ("cache", "64,1"),
        ("cache", "64,1", "time"),
        ("cache", "64,1", "tile"),
        ("cache", "64,2", "times"),
        ("objective",),
        ("device_name",),
        ("cache", "64,1", "block_size_x"),
    ]
)


@st.composite
def mutated_cache(draw: st.DrawFn) -> str:
    data = _cache_base()
    for _ in range(draw(st.integers(0, 3))):
        path = draw(_FIELD_PATHS)
        node: Any = data
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            if draw(st.booleans()):
                node[path[-1]] = draw(
                    _JSON | st.sampled_from([10**400, 1e308 * 10, -1, "RuntimeFailedConfig"])
                )
            else:
                node.pop(path[-1], None)
    if draw(st.booleans()):  # the cache key not last
        data = {"cache": data.pop("cache", {}), **data}
    try:
        text = json.dumps(data, indent=draw(st.sampled_from([None, 1])))
    except ValueError:  # an integer too long for json's writer: write it ourselves
        text = "{" + '"cache": {}, "tune_params_keys": [' + "9" * 5000 + "]}"
    cut = draw(st.integers(0, len(text)))
    if draw(st.integers(0, 3)) == 0:  # cut off, as a killed recording leaves it
        text = text[:cut]
    return text + draw(st.sampled_from(["", ",", "}", "garbage", "\n"]))


def check_cache(text: str) -> None:
    path = _scratch("caches") / "cache.json"
    path.write_text(text)

    def load() -> Any:
        rec = RecordedSpace.load(path)
        rec.space()
        rec.describe()
        rec.fraction_within(1.1)
        for key in rec.entries:
            rec.measure(dict(zip(rec.keys_order, key, strict=True)))
        return rec

    typed(load)


@FAST
@given(mutated_cache())
def test_kernel_tuner_caches(text: str) -> None:
    check_cache(text)


@pytest.mark.slow
@SLOW
@given(mutated_cache())
def test_kernel_tuner_caches_10k(text: str) -> None:
    check_cache(text)


def test_cache_key_not_last_is_read(tmp_path: Path) -> None:
    data = _cache_base()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"cache": data.pop("cache"), **data}))
    assert RecordedSpace.load(path).optimum == pytest.approx(6.4)


def test_huge_time_is_not_a_measurement(tmp_path: Path) -> None:
    data = _cache_base()
    data["cache"]["64,1"]["time"] = 10**400
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    assert RecordedSpace.load(path).values[(64, 1)] is None


# -- stored runs ---------------------------------------------------------------------------------

RUN_ID = "run-1"


def _template_store() -> Path:
    folder = _scratch("template")
    db = folder / STORE_FILE
    if db.is_file():
        return db
    with Store(db) as store:
        store.save_run(RUN_ID, "p", {"seed": 1})
        cand = Candidate(source="class ModelNew: pass", generator="offline")
        h = store.save_candidate(cand, run_id=RUN_ID)
        timing = TimingStats(
            median_ms=1.0, iqr_ms=0.1, ci95_low_ms=0.9, ci95_high_ms=1.1, mean_ms=1.0, min_ms=0.9, n=5
        )
        record = EvalRecord(
            candidate_hash=h,
            eval_key="k",
            problem="p",
            backend="opencl",
            device="d",
            outcome=Outcome.correct,
            timing=timing,
            speedup=2.0,
        )
        store.save_evaluation(record, run_id=RUN_ID)
        store.execute("INSERT INTO loop_state VALUES (?, ?)", (RUN_ID, LoopState().model_dump_json()))
        store.execute(
            "INSERT INTO loop_proposals (run_id, generation, idx, candidate, ask, generator, coords, record) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (
                RUN_ID,
                0,
                0,
                cand.model_dump_json(),
                SearchAsk().model_dump_json(),
                "offline",
                "[1, 2, 3]",
                record.model_dump_json(),
            ),
        )
    return db


_COLUMNS = st.sampled_from(
    [
        ("runs", "config"),
        ("runs", "summary"),
        ("candidates", "data"),
        ("evaluations", "record"),
        ("loop_state", "data"),
        ("loop_proposals", "ask"),
        ("loop_proposals", "candidate"),
        ("loop_proposals", "record"),
        ("loop_proposals", "coords"),
        ("meta", "value"),
    ]
)


@st.composite
def damaged_store(draw: st.DrawFn) -> tuple[list[tuple[str, Any]], bool]:
    ops: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["column", "bytes", "truncate", "delete", "empty", "delete_rows"]))
        if kind == "column":
            ops.append(
                (
                    kind,
                    (
                        draw(_COLUMNS),
                        draw(st.text(max_size=30) | st.sampled_from(["{}", "[]", "null", "1e999"])),
                    ),
                )
            )
        elif kind == "bytes":
            ops.append((kind, (draw(st.integers(0, 40_000)), draw(st.binary(min_size=1, max_size=64)))))
        elif kind == "truncate":
            ops.append((kind, draw(st.integers(0, 40_000))))
        elif kind == "delete_rows":
            ops.append((kind, draw(st.sampled_from(["runs", "candidates", "loop_proposals", "meta"]))))
        else:
            ops.append((kind, None))
    return ops, draw(st.booleans())


def check_store(case: tuple[list[tuple[str, Any]], bool]) -> None:
    ops, start_over = case
    folder = _scratch("stored")
    for f in folder.iterdir():
        f.unlink(missing_ok=True)
    db = folder / STORE_FILE
    shutil.copy(_template_store(), db)
    for kind, arg in ops:
        if kind == "column" and db.is_file():
            (table, column), value = arg
            try:
                with contextlib.closing(sqlite3.connect(db)) as raw, raw:
                    raw.execute(f"UPDATE {table} SET {column}=?", (value,))
            except (sqlite3.Error, UnicodeDecodeError):
                pass  # already damaged by an earlier step
        elif kind == "delete_rows" and db.is_file():
            try:
                with contextlib.closing(sqlite3.connect(db)) as raw, raw:
                    raw.execute(f"DELETE FROM {arg}")
            except (sqlite3.Error, UnicodeDecodeError):
                pass
        elif kind == "bytes" and db.is_file():
            offset, data = arg
            with db.open("r+b") as fh:
                fh.seek(min(offset, max(db.stat().st_size - 1, 0)))
                fh.write(data)
        elif kind == "truncate" and db.is_file():
            with db.open("r+b") as fh:
                fh.truncate(arg)
        elif kind == "delete":
            db.unlink(missing_ok=True)
        elif kind == "empty":
            db.write_bytes(b"")
    typed(lambda: check_resumable(folder, RUN_ID, start_over))
    if db.is_file() and db.stat().st_size:

        def read() -> Any:
            with Store(db, create=False) as store:
                return store.list_runs(), store.evaluations(RUN_ID), store.list_candidates(RUN_ID)

        typed(read)


@FAST
@given(damaged_store())
def test_stored_runs(case: tuple[list[tuple[str, Any]], bool]) -> None:
    check_store(case)


@pytest.mark.slow
@SLOW
@given(damaged_store())
def test_stored_runs_10k(case: tuple[list[tuple[str, Any]], bool]) -> None:
    check_store(case)
