"""Every hook a kfoundry plugin can implement.

Registration hooks hand the plugin a ``register`` callable (see :class:`Register`); the core keeps
control of names, options models and validation. Lifecycle hooks let plugins observe a run or veto a
candidate. The core never calls these directly: it goes through the typed wrappers in
:mod:`kfoundry.core.hooks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pluggy

from kfoundry import PROJECT_NAME

if TYPE_CHECKING:
    import click
    from pydantic import BaseModel

    from kfoundry.core.models import Candidate, EvalRecord

hookspec = pluggy.HookspecMarker(PROJECT_NAME)


class Register(Protocol):
    """The callable handed to every registration hook.

    ``register(name, factory, options=OptionsModel, description="...")``: ``name`` must be unique
    within its kind; ``factory(options)`` builds the plugin object from a validated instance of
    ``options`` (a pydantic model; the default accepts no options).
    """

    def __call__(
        self,
        name: str,
        factory: Any,
        *,
        options: type[BaseModel] | None = None,
        description: str = "",
    ) -> None: ...


# --- registration -------------------------------------------------------------------------------


@hookspec
def kf_register_backends(register: Register) -> None:
    """Register hardware backends (factory returns a :class:`kfoundry.core.backend.Backend`)."""


@hookspec
def kf_register_llms(register: Register) -> None:
    """Register kernel generators: LLM providers and the offline generator (``Generator`` objects)."""


@hookspec
def kf_register_search(register: Register) -> None:
    """Register search strategies (ask/tell ``SearchStrategy`` objects: MAP-Elites, GA, random)."""


@hookspec
def kf_register_tuners(register: Register) -> None:
    """Register template-parameter tuners (ask/tell ``Tuner`` objects)."""


@hookspec
def kf_register_hardware(register: Register) -> None:
    """Register hardware detectors that turn a backend's device into a ``DeviceProfile``."""


@hookspec
def kf_register_executors(register: Register) -> None:
    """Register executors that run evaluations (local process pool, Ray, ...)."""


@hookspec
def kf_register_descriptors(register: Register) -> None:
    """Register behaviour-descriptor extractors per kernel language (for the MAP-Elites archive)."""


@hookspec
def kf_register_commands(cli: click.Group) -> None:
    """Add ``kf-run`` subcommands: call ``cli.add_command(...)`` or decorate with ``@cli.command()``.

    ``cli`` is the ``kf-run`` click group (simonw/llm's ``register_commands`` pattern). A name that a
    built-in command already has is refused with a warning; ``kf-run report`` and ``kf-run export``
    are registered this way by kfoundry's own plugins.
    """


# --- lifecycle ----------------------------------------------------------------------------------


@hookspec
def kf_static_checks(candidate: Candidate, problem_name: str) -> list[str] | None:
    """Inspect a candidate before it is compiled; return reasons to reject it (empty or None: fine)."""


@hookspec
def kf_candidate_evaluated(candidate: Candidate, record: EvalRecord) -> None:
    """Observe one finished evaluation (also called for results served from the cache)."""


@hookspec
def kf_generation_finished(run_id: str, generation: int, summary: dict[str, Any]) -> None:
    """Observe the end of one search generation; ``summary`` holds counts and the best speedup."""


@hookspec
def kf_run_started(run_id: str, config: dict[str, Any]) -> None:
    """Observe the start of a run; ``config`` is the resolved run config as plain data."""


@hookspec
def kf_run_finished(run_id: str, summary: dict[str, Any]) -> None:
    """Observe the end of a run (also after a budget stop); ``summary`` holds the best result."""
