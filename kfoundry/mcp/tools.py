"""The stateless MCP tools: ``evaluate_kernel``, ``list_devices``, ``list_plugins``.

Each takes its validated argument model and returns plain JSON data; bad input raises a one-line
:class:`KfError`.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from kfoundry.core.commands.devices import devices_listing
from kfoundry.core.commands.eval import evaluate
from kfoundry.core.commands.plugins import plugins_listing
from kfoundry.core.models import Candidate
from kfoundry.core.plugins import get_plugin_manager
from kfoundry.mcp.models import EvaluateKernelArgs, NoArgs
from kfoundry.mcp.settings import ServerSettings, backend_language

#: One evaluation at a time per server: the timing phase wants the device to itself anyway.
_EVAL_LOCK = threading.Lock()


def evaluate_kernel(settings: ServerSettings, args: EvaluateKernelArgs) -> dict[str, Any]:
    """Judge a candidate on a problem; the record is exactly what ``kf-run eval --json`` prints."""
    overrides = dict(args.overrides)
    if args.device is not None:
        overrides["backend.device"] = args.device
    if args.no_cache:
        overrides["evaluation.cache"] = False
    config = settings.config(overrides, backend=args.backend, shapes=args.shapes, validate_plugins=False)
    candidate: str | Candidate
    if args.path is not None:
        candidate = args.path  # read after the problem is loaded, as `kf-run eval` does
    else:
        assert args.source is not None  # the model asks for exactly one of them
        candidate = Candidate(
            source=args.source,
            kind="native" if Path(args.problem).suffix == ".toml" else "kernelbench",
            language=backend_language(config),
            params=dict(args.params),
            label="mcp-source",
        )
    with _EVAL_LOCK:
        record = evaluate(args.problem, candidate, config, params=dict(args.params))
    data: dict[str, Any] = json.loads(record.model_dump_json())
    return data


def list_devices(settings: ServerSettings, args: NoArgs) -> dict[str, Any]:
    """Every device every backend can see, as ``kf-run devices --json``."""
    return {"backends": devices_listing()}


def list_plugins(settings: ServerSettings, args: NoArgs) -> dict[str, Any]:
    """Every loaded plugin, as ``kf-run plugins --json``."""
    return {"plugins": plugins_listing(), "skipped": get_plugin_manager().skipped}
