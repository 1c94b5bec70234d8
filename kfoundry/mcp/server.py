"""The ``kf-run mcp`` server: kfoundry's tools and run resources over MCP (the official SDK, stdio).

Tools validate their arguments with pydantic models (:mod:`kfoundry.mcp.models`) and run in worker
threads, so a long evaluation never blocks the server; optimisations run in child processes
(:mod:`kfoundry.mcp.runs`). A bad call (a missing field, a wrong type, an unknown problem or run)
answers a tool error (``isError``) whose text is one line, and the server goes on serving. Resources:
each run's status (JSON), its exported best kernel and any report in its folder.
"""

from __future__ import annotations

import json
import logging
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ValidationError

from kfoundry import __version__
from kfoundry.core.errors import KfError
from kfoundry.core.loop import RUN_FILE
from kfoundry.mcp import kernels, tools
from kfoundry.mcp.models import (
    EvaluateKernelArgs,
    GetKernelArgs,
    NoArgs,
    RunStatusArgs,
    SearchKernelsArgs,
    StartOptimizationArgs,
    one_line,
)
from kfoundry.mcp.runs import RunError, RunManager, run_folder
from kfoundry.mcp.settings import ServerSettings

log = logging.getLogger(__name__)

URI_PREFIX = "kfoundry://runs/"
#: Files of a run folder served as resources: exported kernels, the best kernel's record, reports.
RESOURCE_GLOBS = ("best_*", "best.json", "*.html", "*.md", "report*")


@dataclass(frozen=True)
class ToolDef:
    """One tool: its name, what it does, its argument model and the function that does it."""

    name: str
    description: str
    args: type[BaseModel]
    run: Callable[[Any], dict[str, Any]]
    read_only: bool = True


def tool_defs(settings: ServerSettings, runs: RunManager) -> list[ToolDef]:
    """The server's tools, bound to its settings and run manager."""

    def bind(fn: Callable[[ServerSettings, Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
        return lambda args: fn(settings, args)

    return [
        ToolDef(
            "evaluate_kernel",
            "Judge a kernel on a problem: compile, check against the reference over many "
            "trials, time it; returns the verdict, timing, speedup, roofline share and on failure the one-line "
            "reason, exactly as `kf-run eval --json`.",
            EvaluateKernelArgs,
            bind(tools.evaluate_kernel),
        ),
        ToolDef(
            "start_optimization",
            "Start an optimisation run of a problem in the background (search, "
            "evaluate, tune, export); returns its run id at once. Poll it with run_status.",
            StartOptimizationArgs,
            runs.start,
            read_only=False,
        ),
        ToolDef(
            "run_status",
            "Progress of a run (status, generation, evaluations, the best kernel so far) and its "
            "summary once finished.",
            RunStatusArgs,
            runs.status,
        ),
        ToolDef(
            "stop_optimization",
            "Stop a run started by start_optimization (what it found stays; `kf-run resume RUN_DIR` continues it).",
            RunStatusArgs,
            runs.stop,
            read_only=False,
        ),
        ToolDef(
            "search_kernels",
            "Correct kernels from every run under the runs root, fastest first, filtered by "
            "problem or operation family, backend and device.",
            SearchKernelsArgs,
            bind(kernels.search_kernels),
        ),
        ToolDef(
            "get_kernel",
            "A kernel's source and record, by run id and candidate id.",
            GetKernelArgs,
            bind(kernels.get_kernel),
        ),
        ToolDef(
            "list_devices",
            "Every device every backend can see, with its profile and peak rates.",
            NoArgs,
            bind(tools.list_devices),
        ),
        ToolDef(
            "list_plugins",
            "Every loaded kfoundry plugin: names registered, package, version, hooks.",
            NoArgs,
            bind(tools.list_plugins),
        ),
    ]


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    schema.setdefault("properties", {})
    return schema


def _error(name: str, message: str) -> types.CallToolResult:
    line = " ".join(f"{name}: {message}".split())
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"error: {line}")],
        structured_content={"error": line},
        is_error=True,
    )


def call(defs: dict[str, ToolDef], name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
    """Run one tool call to its result (blocking); every failure becomes a one-line tool error."""
    tool = defs[name]
    try:
        args = tool.args.model_validate(arguments or {})
    except ValidationError as exc:
        return _error(name, one_line(exc))
    try:
        data = tool.run(args)
    except KfError as exc:
        return _error(name, str(exc))
    except Exception as exc:  # a bug must cost this call, never the server
        log.exception("tool %s failed", name)
        return _error(name, f"internal error: {type(exc).__name__}: {exc}")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(data, indent=2))], structured_content=data
    )


# -- resources ----------------------------------------------------------------------------------------


def _run_files(folder: Path) -> list[Path]:
    seen: dict[str, Path] = {}
    for pattern in RESOURCE_GLOBS:
        for path in folder.glob(pattern):
            if path.is_file():
                seen[path.name] = path
    return [seen[k] for k in sorted(seen)]


def list_resources(settings: ServerSettings) -> list[types.Resource]:
    """Each run's status and the files worth reading in its folder."""
    out: list[types.Resource] = []
    if not settings.runs_root.is_dir():
        return out
    for folder in sorted(p for p in settings.runs_root.iterdir() if (p / RUN_FILE).is_file()):
        out.append(
            types.Resource(
                uri=f"{URI_PREFIX}{folder.name}/status",
                name=f"{folder.name} status",
                description="Progress and best kernel of the run",
                mime_type="application/json",
            )
        )
        for path in _run_files(folder):
            mime = mimetypes.guess_type(path.name)[0] or "text/plain"
            out.append(
                types.Resource(
                    uri=f"{URI_PREFIX}{folder.name}/{path.name}",
                    name=f"{folder.name}/{path.name}",
                    mime_type=mime,
                    size=path.stat().st_size,
                )
            )
    return out


def read_resource(settings: ServerSettings, runs: RunManager, uri: str) -> tuple[str, str]:
    """(text, mime type) of a run resource; an unknown one raises :class:`RunError`."""
    if not uri.startswith(URI_PREFIX) or uri.count("/") != 4:
        raise RunError(f"unknown resource {uri!r} (expected {URI_PREFIX}RUN_ID/status or /FILE)")
    run_id, name = uri[len(URI_PREFIX) :].split("/")
    folder = run_folder(settings, run_id)
    if name == "status":
        return json.dumps(runs.status(RunStatusArgs(run_id=run_id)), indent=2), "application/json"
    files = {p.name: p for p in _run_files(folder)}
    if name not in files:
        raise RunError(
            f"run {run_id!r} has no resource {name!r} (has: status, {', '.join(files) or 'nothing else'})"
        )
    path = files[name]
    return path.read_text(errors="replace"), mimetypes.guess_type(path.name)[0] or "text/plain"


# -- the server ----------------------------------------------------------------------------------------


def build_server(settings: ServerSettings) -> Server[Any]:
    """An MCP server with kfoundry's tools and run resources."""
    runs = RunManager(settings)
    defs = {d.name: d for d in tool_defs(settings, runs)}
    tool_list = [
        types.Tool(
            name=d.name,
            description=d.description,
            input_schema=_schema(d.args),
            annotations=types.ToolAnnotations(read_only_hint=d.read_only, open_world_hint=False),
        )
        for d in defs.values()
    ]

    async def on_list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list)

    async def on_call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name not in defs:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r} (known: {', '.join(defs)})")
        return await anyio.to_thread.run_sync(call, defs, params.name, params.arguments)

    async def on_list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=await anyio.to_thread.run_sync(list_resources, settings))

    async def on_list_resource_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    uri_template=URI_PREFIX + "{run_id}/status",
                    name="run status",
                    mime_type="application/json",
                ),
                types.ResourceTemplate(
                    uri_template=URI_PREFIX + "{run_id}/{file}",
                    name="run file",
                    description="An exported kernel (best_*), best.json or a report of the run",
                ),
            ]
        )

    async def on_read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        try:
            text, mime = await anyio.to_thread.run_sync(read_resource, settings, runs, str(params.uri))
        except KfError as exc:
            raise MCPError(types.INVALID_PARAMS, " ".join(str(exc).split())) from None
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=str(params.uri), text=text, mime_type=mime)]
        )

    return Server(
        "kfoundry",
        version=__version__,
        instructions="kfoundry finds fast, correct GPU kernels: evaluate a kernel, start and poll optimisation "
        "runs, search the kernels they found. Paths are on the server's machine.",
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
        on_list_resources=on_list_resources,
        on_list_resource_templates=on_list_resource_templates,
        on_read_resource=on_read_resource,
    )


async def serve_stdio(settings: ServerSettings) -> None:
    """Serve over stdin/stdout until the client closes the connection."""
    server = build_server(settings)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
