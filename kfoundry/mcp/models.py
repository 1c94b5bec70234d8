"""The MCP tools' arguments: one pydantic model per tool (unknown keys are errors).

Field types are the CLI's own: shapes as in ``problem.shapes``, template parameters as ``--params``,
config overrides as ``--set`` (dotted key paths, validated by :class:`RunConfig`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kfoundry.core.models import ParamValue

ShapeValues = dict[str, int | float]


class ToolArgs(BaseModel):
    """Base of every tool's arguments: unknown keys are errors, values are not coerced ("8" is no int)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class EvaluateKernelArgs(ToolArgs):
    problem: str = Field(
        description="Problem file: a KernelBench .py or a native task .toml (path on the server)."
    )
    source: str | None = Field(
        default=None,
        description="Candidate source: a KernelBench ModelNew module, or raw kernel source for a native task.",
    )
    path: str | None = Field(
        default=None, description="Candidate file instead of source (.py, .cl, .cu, ...)."
    )
    backend: str | None = Field(
        default=None, description="Backend plugin (default: the server config's, opencl)."
    )
    device: str | int | None = Field(default=None, description="Device index or name substring.")
    shapes: ShapeValues = Field(
        default_factory=dict, description="Shape constant overrides, e.g. {batch_size: 8}."
    )
    params: dict[str, ParamValue] = Field(default_factory=dict, description="Template parameter values.")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description='Config overrides by key path, e.g. {"evaluation.trials": 3}.'
    )
    no_cache: bool = Field(default=False, description="Evaluate again even if the store has this result.")

    @model_validator(mode="after")
    def _one_candidate(self) -> EvaluateKernelArgs:
        if (self.source is None) == (self.path is None):
            raise ValueError("give exactly one of source and path")
        return self


class StartOptimizationArgs(ToolArgs):
    problem: str = Field(
        description="Problem file: a KernelBench .py or a native task .toml (path on the server)."
    )
    backend: str | None = Field(
        default=None, description="Backend plugin (default: the server config's, opencl)."
    )
    shapes: ShapeValues = Field(default_factory=dict, description="Shape constant overrides.")
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description='Config overrides by key path, e.g. {"budget.generations": 4, "search.name": "ga"}.',
    )
    seed_kernel: str | None = Field(
        default=None,
        description="Naive seed kernel file (default: the problem's seeds/<name>_<language>.py).",
    )


class RunStatusArgs(ToolArgs):
    run_id: str = Field(description="A run id returned by start_optimization (a folder under the runs root).")


class SearchKernelsArgs(ToolArgs):
    problem: str | None = Field(default=None, description="Problem name or file (its stem is the name).")
    op_family: str | None = Field(
        default=None, description="Operation family (softmax, matmul, elementwise, layer_norm, reduce, ...)."
    )
    backend: str | None = Field(default=None, description="Backend plugin name.")
    device: str | None = Field(default=None, description="Case-insensitive substring of the device name.")
    limit: int = Field(default=20, ge=1, le=500, description="Most kernels returned, fastest first.")


class GetKernelArgs(ToolArgs):
    run_id: str = Field(description="The run the kernel belongs to.")
    candidate_id: str = Field(
        min_length=6,
        pattern=r"^[0-9a-f]+$",
        description="The kernel's candidate id (its hash, or a unique prefix).",
    )


class NoArgs(ToolArgs):
    """A tool without arguments."""


_TYPE_TAGS = {"int", "float", "str", "bool", "none", "dict", "list"}


def _is_branch(loc: tuple[Any, ...]) -> bool:
    """Whether ``loc`` ends in a union member's tag (pydantic's loc for each failed member)."""
    return bool(loc) and isinstance(loc[-1], str) and (loc[-1] in _TYPE_TAGS or "[" in loc[-1])


def one_line(exc: ValidationError) -> str:
    """The first validation problem on one line: where it is and what it is."""
    errors = exc.errors()
    err = errors[0]
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        return f"unknown argument {'.'.join(map(str, loc))}"
    if err["type"] == "missing":
        return f"missing argument {'.'.join(map(str, loc))}"
    branches = [e for e in errors if _is_branch(tuple(e["loc"])) and tuple(e["loc"])[:-1] == loc[:-1]]
    if _is_branch(loc) and len(branches) > 1:  # a value matching none of a union's members
        where = ".".join(map(str, loc[:-1])) or "arguments"
        tags = [str(e["loc"][-1]) for e in branches]
        rest = len(errors) - len(branches)
        more = f" (+{rest} more)" if rest else ""
        return f"{where}: expected {', '.join(tags[:-1])} or {tags[-1]} (got {err['input']!r}){more}"
    where = ".".join(map(str, loc)) or "arguments"
    msg = err["msg"].removeprefix("Value error, ")
    got = f" (got {err['input']!r})" if err["type"] != "value_error" else ""
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return " ".join(f"{where}: {msg}{got}{more}".split())
