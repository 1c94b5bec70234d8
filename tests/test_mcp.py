"""``kf-run mcp`` driven through the MCP SDK's own stdio client: real evaluations on PoCL, a real
background optimisation, the kernel search over its store, malformed calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from kfoundry.core.errors import ConfigError  # noqa: E402
from kfoundry.core.models import EvalRecord  # noqa: E402
from kfoundry.mcp.models import EvaluateKernelArgs, one_line  # noqa: E402
from kfoundry.mcp.runs import RunError, run_folder  # noqa: E402
from kfoundry.mcp.settings import ServerSettings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOFTMAX = "examples/kernelbench/softmax.py"
SEED = "examples/kernelbench/seeds/softmax_opencl.py"
EVAL_SHAPES = {"batch_size": 8, "dim": 520}
RUN_SHAPES = {"batch_size": 4, "dim": 96}
#: The server's base config: timing phases of milliseconds, required and structured trials only.
FAST = [
    "evaluation.trials=2",
    "evaluation.target_time_s=0.005",
    "evaluation.warmup_s=0.0",
    "evaluation.min_repeats=3",
    "evaluation.max_repeats=10",
    "evaluation.rotate_bytes=0",
    "evaluation.timeout_s=60",
    "evaluation.correctness_budget_s=0.0",
    "evaluation.shape_variants=0",
]
TOOLS = {
    "evaluate_kernel",
    "start_optimization",
    "stop_optimization",
    "run_status",
    "search_kernels",
    "get_kernel",
    "list_devices",
    "list_plugins",
}

#: A problem no bundled generator writes kernels for: start_optimization refuses it before a folder exists.
DETERMINANT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.linalg.det(x)


def get_inputs():
    return [torch.rand(16, 4, 4)]


def get_init_inputs():
    return []
"""
#: The seed with its last pass not dividing by the sum: compiles, runs, and is wrong.
BROKEN = (ROOT / SEED).read_text().replace("exp(row[j] - m) / s;", "exp(row[j] - m);")


@asynccontextmanager
async def kf_session(runs_root: Path, errlog: Any) -> AsyncIterator[ClientSession]:
    args = ["-m", "kfoundry.mcp", "--runs-root", str(runs_root)] + [x for s in FAST for x in ("--set", s)]
    params = StdioServerParameters(command=sys.executable, args=args, env=dict(os.environ), cwd=str(ROOT))
    async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, args)
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    data = result.structured_content
    assert isinstance(data, dict)
    assert json.loads(result.content[0].text) == data  # type: ignore[union-attr]
    return data


async def error_line(session: ClientSession, tool: str, args: Any) -> str:
    result = await session.call_tool(tool, args)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert "\n" not in text and text.startswith(f"error: {tool}: "), text
    return text


def _run(tmp_path: Path, session: Callable[[ClientSession, Path], Awaitable[None]]) -> None:
    """Run ``session`` against a fresh server whose runs root is ``tmp_path/runs`` (its log shown on failure)."""
    runs_root = tmp_path / "runs"

    async def main() -> None:
        with open(tmp_path / "server.log", "w") as errlog:
            async with kf_session(runs_root, errlog) as s:
                await session(s, runs_root)

    try:
        anyio.run(main)
    except BaseException:
        print((tmp_path / "server.log").read_text()[-4000:])
        raise


async def evaluate_seed(s: ClientSession, runs_root: Path) -> dict[str, Any]:
    """The seed evaluates correct, with a time, while other calls are answered at once."""
    seed: dict[str, Any] = {}

    async def evaluate() -> None:
        seed.update(
            await call(s, "evaluate_kernel", {"problem": SOFTMAX, "path": SEED, "shapes": EVAL_SHAPES})
        )
        seed["done_at"] = time.monotonic()

    async with anyio.create_task_group() as tg:
        tg.start_soon(evaluate)
        await anyio.sleep(0.5)
        assert (await call(s, "search_kernels", {"problem": "softmax"}))["runs_root"] == str(
            runs_root.resolve()
        )
        answered_at = time.monotonic()
    assert answered_at < seed.pop("done_at")  # the search was answered while the evaluation ran
    record = EvalRecord.model_validate(seed)
    assert record.outcome.value == "correct" and record.timing is not None and record.timing.median_ms > 0
    assert record.reference_timing is not None and record.speedup is not None
    assert set(seed) == set(EvalRecord.model_fields)
    return seed


async def malformed_calls(s: ClientSession, good: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    """Each malformed call answers one line; the server then serves the ``good`` call."""
    (tmp_path / "determinant.py").write_text(DETERMINANT)
    bad = [
        (
            "start_optimization",
            {"problem": str(tmp_path / "determinant.py")},
            "offline generator: problem 'determinant' is not a known operation family",
        ),
        ("evaluate_kernel", {"path": SEED}, "missing argument problem"),
        (
            "evaluate_kernel",
            {"problem": SOFTMAX, "path": SEED, "shapes": {"batch_size": "big"}},
            "shapes.batch_size: expected int or float (got 'big')",
        ),
        ("evaluate_kernel", {"problem": 3, "path": SEED}, "problem: Input should be a valid string (got 3)"),
        (
            "evaluate_kernel",
            {"problem": "examples/kernelbench/nope.py", "path": SEED},
            "problem file not found: examples/kernelbench/nope.py",
        ),
        (
            "evaluate_kernel",
            {"problem": SOFTMAX, "path": SEED, "source": "x"},
            "give exactly one of source and path",
        ),
        (
            "evaluate_kernel",
            {"problem": SOFTMAX, "path": SEED, "shapes": {"rows": 3}},
            "unknown shape constant 'rows'",
        ),
        ("evaluate_kernel", {"problem": SOFTMAX, "path": "nope.cl"}, "candidate file not found: nope.cl"),
        ("evaluate_kernel", {"problem": SOFTMAX, "path": SEED, "backend": "vulkan"}, "vulkan"),
        (
            "start_optimization",
            {"problem": SOFTMAX, "overrides": {"budget.generations": 0}},
            "config error: budget.generations",
        ),
        (
            "start_optimization",
            {"problem": SOFTMAX, "overrides": {"output_dir": "/tmp"}},
            "set by the server",
        ),
        ("start_optimization", {"problem": SOFTMAX, "colour": "red"}, "unknown argument colour"),
        ("start_optimization", {"problem": "examples/kernelbench/nope.py"}, "problem file not found"),
        ("run_status", {}, "missing argument run_id"),
        ("stop_optimization", {"run_id": "nope"}, "unknown run id 'nope'"),
        ("run_status", {"run_id": "../etc"}, "unknown run id '../etc'"),
        ("get_kernel", {"run_id": "x", "candidate_id": "0123456789"}, "unknown run id 'x'"),
        ("search_kernels", {"op_family": "fft"}, "unknown family 'fft'"),
        ("search_kernels", {"limit": "5"}, "limit: Input should be a valid integer (got '5')"),
    ]
    for tool, args, expected in bad:
        line = await error_line(s, tool, args)
        assert expected in line, line
        await call(s, *good)
    with pytest.raises(MCPError, match="unknown tool 'optimise'"):
        await s.call_tool("optimise", {})
    await call(s, *good)


async def poll(s: ClientSession, run_id: str) -> dict[str, Any]:
    """run_status until the run is no longer starting or running."""
    deadline = time.monotonic() + 300
    while (status := await call(s, "run_status", {"run_id": run_id}))["status"] in ("starting", "running"):
        assert time.monotonic() < deadline, status
        await anyio.sleep(1.0)
    return status


def test_evaluate_and_malformed_calls(tmp_path: Path) -> None:
    """The tools listed; the seed correct with a time; a broken candidate with its one-line reason;
    malformed calls answered in one line each while the server keeps serving."""

    async def session(s: ClientSession, runs_root: Path) -> None:
        listed = (await s.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        schema = next(t for t in listed if t.name == "evaluate_kernel").input_schema
        assert schema["required"] == ["problem"] and {"source", "path", "shapes", "backend"} <= set(
            schema["properties"]
        )
        await evaluate_seed(s, runs_root)
        broken = await call(
            s, "evaluate_kernel", {"problem": SOFTMAX, "source": BROKEN, "shapes": EVAL_SHAPES}
        )
        assert broken["outcome"] == "mismatch" and broken["timing"] is None
        assert broken["message"] and "\n" not in broken["message"]
        await malformed_calls(s, ("list_plugins", {}), tmp_path)
        devices = await call(s, "list_devices", {})
        assert any(b["backend"] == "opencl" and b["devices"] for b in devices["backends"])
        assert (await call(s, "search_kernels", {}))["kernels"] == []  # no run folder yet
        assert (await s.list_resources()).resources == []

    _run(tmp_path, session)


@pytest.mark.slow
def test_agent_session_end_to_end(tmp_path: Path) -> None:
    """The issue's whole session: evaluate, start a two-generation optimisation, poll it to the end, find its
    best kernel with search_kernels and get_kernel, read its resources; the record is `kf-run eval --json`'s."""

    async def session(s: ClientSession, runs_root: Path) -> None:
        started = await call(
            s,
            "start_optimization",
            {
                "problem": SOFTMAX,
                "shapes": RUN_SHAPES,
                "overrides": {
                    "budget.generations": 2,
                    "budget.proposals_per_generation": 2,
                    "tuner.every": -1,
                },
            },
        )
        run_id = started["run_id"]
        assert started["status"] == "running" and (runs_root / run_id / "run.json").is_file()
        # a run that fails (its problem file is gone before the run reads it) costs that run, not the server
        gone = tmp_path / "softmax_gone.py"
        gone.write_text((ROOT / SOFTMAX).read_text())
        failing = (await call(s, "start_optimization", {"problem": str(gone), "shapes": RUN_SHAPES}))[
            "run_id"
        ]
        gone.unlink()
        # a run stopped by the agent: its whole process group ends, the folder stays resumable
        stopping = (await call(s, "start_optimization", {"problem": SOFTMAX, "shapes": RUN_SHAPES}))["run_id"]
        stopped = await call(s, "stop_optimization", {"run_id": stopping})
        assert stopped["status"] == "stopped" and stopped["process"]["alive"] is False, stopped
        assert (await call(s, "run_status", {"run_id": stopping}))["status"] == "stopped"
        seed = await evaluate_seed(s, runs_root)  # while the runs go on in the background

        # exactly `kf-run eval --json`: the CLI on the same cache returns the same record
        cli = subprocess.run(
            [
                sys.executable,
                "-c",
                "from kfoundry.core.cli import main; main()",
                "eval",
                SOFTMAX,
                SEED,
                "--json",
                "--set",
                f"output_dir={runs_root}",
                *[x for f in FAST for x in ("--set", f)],
                *[x for k, v in EVAL_SHAPES.items() for x in ("--shape", f"{k}={v}")],
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert cli.returncode == 0, cli.stderr
        from_cli = json.loads(cli.stdout)
        assert from_cli.pop("cached") is True and seed.pop("cached") is False
        assert from_cli == seed

        await malformed_calls(s, ("run_status", {"run_id": run_id}), tmp_path)
        status = await poll(s, run_id)
        assert status["status"] == "finished", status
        failed = await poll(s, failing)
        assert failed["status"] == "failed" and failed["process"]["returncode"] == 2, failed
        assert failed["error"] == f"error: problem file not found: {gone}", failed
        assert status["generation"] == 2 and status["stop_reason"] == "all 2 generations done"
        assert status["evaluations"] >= 3 and status["summary"]["best_outcome"] == "correct"
        best = status["best"]
        assert best["outcome"] == "correct" and best["median_ms"] > 0

        # its best kernel is found by search_kernels (by problem, and by operation family) and get_kernel
        found = await call(
            s, "search_kernels", {"problem": SOFTMAX, "op_family": "softmax", "backend": "opencl"}
        )
        ours = [k for k in found["kernels"] if k["run_id"] == run_id]
        assert ours[0]["candidate_id"] == best["candidate_id"] and ours[0]["median_ms"] == best["median_ms"]
        assert [k["median_ms"] for k in found["kernels"]] == sorted(k["median_ms"] for k in found["kernels"])
        assert (await call(s, "search_kernels", {"problem": "softmax", "backend": "cuda"}))["kernels"] == []
        assert (await call(s, "search_kernels", {"op_family": "matmul"}))["kernels"] == []
        kernel = await call(s, "get_kernel", {"run_id": run_id, "candidate_id": best["candidate_id"][:8]})
        assert "class ModelNew" in kernel["source"] and kernel["record"]["outcome"] == "correct"
        assert kernel["best_of_run"] is True
        line = await error_line(s, "get_kernel", {"run_id": run_id, "candidate_id": "0123456789"})
        assert f"no candidate '0123456789' in run '{run_id}'" in line

        # resources: the run's status and its exported kernel
        uris = {str(r.uri) for r in (await s.list_resources()).resources}
        exported = f"kfoundry://runs/{run_id}/best_softmax_opencl.py"
        assert f"kfoundry://runs/{run_id}/status" in uris and exported in uris
        text = (await s.read_resource(exported)).contents[0].text  # type: ignore[union-attr]
        assert "class ModelNew" in text
        status_text = (await s.read_resource(f"kfoundry://runs/{run_id}/status")).contents[0].text  # type: ignore[union-attr]
        assert json.loads(status_text)["status"] == "finished"
        with pytest.raises(MCPError, match="unknown run id"):
            await s.read_resource("kfoundry://runs/nope/status")

    _run(tmp_path, session)


def test_argument_errors_are_one_line() -> None:
    cases = [
        ({"path": SEED}, "missing argument problem"),
        ({"problem": SOFTMAX, "path": SEED, "device": 1.5}, "device: expected str or int (got 1.5)"),
        (
            {"problem": SOFTMAX, "path": SEED, "params": {"B": [1]}},
            "params.B: expected int, float, str or bool (got [1])",
        ),
        (
            {"problem": SOFTMAX, "path": SEED, "no_cache": "yes"},
            "no_cache: Input should be a valid boolean (got 'yes')",
        ),
        ({"problem": SOFTMAX}, "arguments: give exactly one of source and path"),
    ]
    for args, expected in cases:
        with pytest.raises(ValidationError) as info:
            EvaluateKernelArgs.model_validate(args)
        assert one_line(info.value) == expected


def test_settings_and_run_ids(tmp_path: Path) -> None:
    settings = ServerSettings.create(tmp_path, None, ("budget.generations=3",))
    config = settings.config({"evaluation.trials": 4}, backend="opencl")
    assert config.budget.generations == 3 and config.evaluation.trials == 4
    assert config.output_dir == str(tmp_path.resolve())
    with pytest.raises(ConfigError, match="unknown key evaluation.trails"):
        settings.config({"evaluation.trails": 4})
    with pytest.raises(ConfigError, match="backend.name"):
        settings.config({}, backend="nope")
    for run_id in ("../x", "a/b", "", "missing"):
        with pytest.raises(RunError, match="unknown run id"):
            run_folder(settings, run_id)


def test_bad_server_config_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kfoundry.mcp", "--runs-root", str(tmp_path), "--set", "budget.generations=0"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: config error: budget.generations"), proc.stderr


def test_mcp_is_a_command_plugin() -> None:
    from kfoundry.core.cli import cli
    from kfoundry.core.plugins import get_plugin_manager

    assert "kf_register_commands" in get_plugin_manager().infos["mcp"].hooks
    assert cli.commands["mcp"].callback.__module__ == "kfoundry.mcp.command"  # type: ignore[union-attr]
