"""Every hook a kfoundry plugin can implement.

Registration hooks hand the plugin a ``register`` callable (see :class:`Register`); the core keeps
control of names, options models and validation. Lifecycle hooks let plugins observe a run or veto a
candidate. The core never calls these directly: it goes through the typed wrappers in
:mod:`kfoundry.core.hooks`. Every implementation of a hook is called, in the reverse order of
registration (pluggy's); none is ``firstresult``. ``docs/hooks.md`` is generated from this module
(``python -m kfoundry.core.docgen hooks > docs/hooks.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pluggy

from kfoundry import PROJECT_NAME

if TYPE_CHECKING:
    import click
    from pydantic import BaseModel

    from kfoundry.core.config import RunConfig
    from kfoundry.core.models import Candidate, EvalRecord
    from kfoundry.core.payloads import GenerationSummary, RunSummary

__all__ = [
    "Register",
    "kf_candidate_evaluated",
    "kf_generation_finished",
    "kf_register_backends",
    "kf_register_commands",
    "kf_register_descriptors",
    "kf_register_executors",
    "kf_register_hardware",
    "kf_register_languages",
    "kf_register_llms",
    "kf_register_search",
    "kf_register_tuners",
    "kf_run_finished",
    "kf_run_started",
    "kf_static_checks",
]

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
# Called once, when the plugin manager loads the plugins (entry points of group ``kfoundry``).


@hookspec
def kf_register_backends(register: Register) -> None:
    """Register hardware backends.

    :param register:
        ``register(name, factory, options=..., description=...)``; ``factory(options)`` returns a
        :class:`kfoundry.core.backend.Backend`. ``backend.name`` in a run config picks one.

    Added in 0.1.0.
    """


@hookspec
def kf_register_llms(register: Register) -> None:
    """Register kernel generators: language-model providers and the offline generator.

    :param register:
        ``register(name, factory, options=..., description=...)``; ``factory(options)`` returns a
        :class:`kfoundry.core.generator.Generator`. ``[[llms]] name`` in a run config picks one.

    Added in 0.1.0.
    """


@hookspec
def kf_register_search(register: Register) -> None:
    """Register search strategies.

    :param register:
        ``register(name, factory, options=..., description=...)``; ``factory(options)`` returns an
        ask/tell :class:`kfoundry.core.search.SearchStrategy` (MAP-Elites, GA, random);
        ``search.name`` picks one.

    Added in 0.1.0.
    """


@hookspec
def kf_register_tuners(register: Register) -> None:
    """Register template-parameter tuners.

    :param register:
        ``register(name, factory, options=..., description=...)``; ``factory(options)`` returns an
        ask/tell :class:`kfoundry.core.tuner.Tuner`. ``tuner.name`` picks one.

    Added in 0.1.0.
    """


@hookspec
def kf_register_hardware(register: Register) -> None:
    """Register hardware detectors.

    :param register:
        ``register(name, factory, options=..., description=...)``; ``factory(options)`` returns a
        :class:`kfoundry.core.hardware.HardwareDetector` that turns a backend's devices into
        :class:`kfoundry.core.models.DeviceProfile` objects (``kf-run devices``).

    Added in 0.1.0.
    """


@hookspec
def kf_register_executors(register: Register) -> None:
    """Register executors, which run evaluations (the local process pool, Ray, ...).

    :param register:
        ``register(name, factory, options=..., description=...)``; ``factory(options)`` returns a
        :class:`kfoundry.core.evaluation.executor.Executor`. ``executor.name`` picks one.

    Added in 0.1.0.
    """


@hookspec
def kf_register_descriptors(register: Register) -> None:
    """Register behaviour-descriptor extractors, one per kernel language (the MAP-Elites axes).

    :param register:
        ``register(language, factory, options=..., description=...)``; the name is the language
        the extractor reads; ``factory(options)`` returns a
        :class:`kfoundry.core.descriptors.DescriptorExtractor`.

    Added in 0.1.0.
    """


@hookspec
def kf_register_languages(register: Register) -> None:
    """Register kernel languages.

    :param register:
        ``register(name, spec)`` with a :class:`kfoundry.core.languages.LanguageSpec` (a spec is its
        own factory). The name must equal ``spec.name`` and be unique; a backend registers the
        language it compiles (``Backend.language``).

    Added in 0.1.0 (issue 15: languages are plugins).
    """


@hookspec
def kf_register_commands(cli: click.Group) -> None:
    """Add ``kf-run`` subcommands.

    :param cli:
        The ``kf-run`` click group (simonw/llm's ``register_commands`` pattern): call
        ``cli.add_command(...)`` or decorate with ``@cli.command()``.

    A name that a built-in command already has is refused with a warning, and a hook that raises
    costs a one-line warning; ``kf-run report`` and ``kf-run export`` are registered this way by
    kfoundry's own plugins. Called when the CLI starts. Added in 0.1.0.
    """


# --- lifecycle ----------------------------------------------------------------------------------
# Called by the optimisation loop and the evaluator, through kfoundry.core.hooks.


@hookspec
def kf_static_checks(candidate: Candidate, problem_name: str) -> list[str] | None:
    """Inspect a candidate before it is compiled.

    :param candidate: The candidate kernel (source, language, template parameters).
    :param problem_name: The name of the problem it is meant to solve.
    :return:
        Reasons to reject it (each a one-line string); empty or None: no objection. The reasons
        of every implementation are joined; any reason makes the evaluation ``rejected``.

    Added in 0.1.0.
    """


@hookspec
def kf_candidate_evaluated(candidate: Candidate, record: EvalRecord) -> None:
    """Observe one finished evaluation (also called for results served from the cache).

    :param candidate: The candidate that was evaluated.
    :param record: Its result: outcome, timing, speedup, resources, descriptors.

    Added in 0.1.0.
    """


@hookspec
def kf_generation_finished(run_id: str, generation: int, summary: GenerationSummary) -> None:
    """Observe the end of one search generation.

    :param run_id: The run's id (its folder name).
    :param generation: The generation that ended, counted from 0.
    :param summary:
        Evaluations so far, the best speedup, the archive coverage; a plugin may add its own
        data under ``summary.extra[<its key>]`` for later implementations to read.

    Added in 0.1.0. Changed in 0.1.0 (issue 15): ``summary`` is a
    :class:`kfoundry.core.payloads.GenerationSummary` (was a dict).
    """


@hookspec
def kf_run_started(run_id: str, config: RunConfig) -> None:
    """Observe the start of a run (also of a resumed one).

    :param run_id: The run's id (its folder name).
    :param config:
        The resolved run config: a :class:`kfoundry.core.config.RunConfig` with every named
        plugin's option defaults filled in. Treat it as read-only.

    Added in 0.1.0. Changed in 0.1.0 (issue 15): ``config`` is a ``RunConfig`` (was a dict).
    """


@hookspec
def kf_run_finished(run_id: str, summary: RunSummary) -> None:
    """Observe the end of a run, budget stops included.

    :param run_id: The run's id (its folder name).
    :param summary:
        How it ended: stop reason, counts, the best kernel and its speedup, where it was
        exported. A plugin may add its own data under ``summary.extra[<its key>]``.

    Added in 0.1.0. Changed in 0.1.0 (issue 15): ``summary`` is a
    :class:`kfoundry.core.payloads.RunSummary` (was a dict).
    """
