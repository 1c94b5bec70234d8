"""Building the run's ensemble from ``config.llms`` (one ledger, recorder, prompt archive and novelty
filter for all members; a resumed run catches up from the store), and its replay configuration."""

from __future__ import annotations

from pathlib import Path

from kfoundry.core.config import LLMConfig, RunConfig
from kfoundry.core.ensemble.members import Ensemble, Member
from kfoundry.core.llm.cost import CostLedger
from kfoundry.core.llm.meta import MetaPrompter, PromptArchive
from kfoundry.core.llm.novelty import NoveltyFilter
from kfoundry.core.llm.provider import LLMProvider, ProviderOptions
from kfoundry.core.llm.recording import RECORDING_NAME, Recorder
from kfoundry.core.plugins import PluginManager, get_plugin_manager
from kfoundry.core.store import Store


def calls_language_model(choice: LLMConfig, manager: PluginManager | None = None) -> bool:
    """Whether a ``config.llms`` member calls a language model: its plugin's factory is an
    :class:`LLMProvider` (each call costs, is capped by the run's ledger and recorded). The loop uses a
    lone member that does not directly, and asks it for more seeds (they are free)."""
    factory = (manager or get_plugin_manager()).get("llm", choice.name).factory
    return isinstance(factory, type) and issubclass(factory, LLMProvider)


def _member_names(config: RunConfig) -> list[str]:
    names: list[str] = []
    for choice in config.llms:
        base = f"{choice.name}:{choice.model}" if choice.model else choice.name
        name, k = base, 2
        while name in names:
            name, k = f"{base}#{k}", k + 1
        names.append(name)
    return names


def build_ensemble(
    config: RunConfig,
    store: Store | None = None,
    *,
    manager: PluginManager | None = None,
    run_id: str | None = None,
    run_dir: str | Path | None = None,
    language: str = "opencl",
    attach: bool = True,
) -> Ensemble:
    """The run's generator: every ``config.llms`` member behind one ensemble.

    ``run_dir`` (default: the store's folder) receives ``llm_calls.jsonl``, the recording that
    ``replay`` serves from; ``attach`` registers the ensemble for the lifecycle hooks.
    """
    manager = manager or get_plugin_manager()
    if run_dir is None and store is not None:
        run_dir = Path(store.path).parent
    ledger = CostLedger(max_tokens=config.budget.llm_tokens, max_cost_usd=config.budget.llm_cost_usd)
    recorder = Recorder(store, Path(run_dir) / RECORDING_NAME if run_dir else None, run_id)
    for call in recorder.previous:  # a resumed run: what was spent before counts against the caps
        if call.error_kind != "budget" and (call.tokens_in or call.tokens_out):
            ledger.add(call.member, call.tokens_in, call.tokens_out, call.cost_usd)
        elif call.error_kind not in (None, "budget"):  # and its failed calls count in the summary
            ledger.fail(call.member, call.error_kind)
    members: list[Member] = []
    for choice, name in zip(config.llms, _member_names(config), strict=True):
        generator = manager.get("llm", choice.name).build(choice.options)
        if isinstance(generator, LLMProvider):
            generator.configure(model=choice.model, name=name, ledger=ledger, recorder=recorder)
            generator.api_key()  # fail now, in one line, if the key's variable is not set
            name = generator.name
        else:
            generator.name = name
        members.append(Member(generator, name, choice.weight))
    llm_members = [m for m in members if m.is_llm]
    prompts = PromptArchive(seed=config.seed, store=store, run_id=run_id) if llm_members else None
    meta = None
    ens = config.ensemble
    if prompts is not None and ens.meta_every > 0:
        chosen = members[ens.meta_llm] if ens.meta_llm < len(members) else llm_members[0]
        model = chosen if chosen.is_llm else llm_members[0]
        assert isinstance(model.generator, LLMProvider)
        meta = MetaPrompter(model.generator, prompts, ens.meta_every, language=language)
    ensemble = Ensemble(
        members,
        mode=ens.mode,
        keep=ens.keep,
        seed=config.seed,
        ledger=ledger,
        recorder=recorder,
        prompts=prompts,
        meta=meta,
        novelty=NoveltyFilter() if ens.novelty else None,
        store=store,
        run_id=run_id,
    )
    if store is not None and run_id is not None:
        _catch_up(ensemble, store, run_id)
    if attach:
        ensemble.attach(manager)
    return ensemble


def _catch_up(ensemble: Ensemble, store: Store, run_id: str) -> None:
    """A resumed run: remember what was already proposed (novelty) and which failures recur (pitfalls)."""
    if ensemble.novelty is not None:
        for c in store.list_candidates(run_id):
            ensemble.novelty.add(c.source, dict(c.params))
    if ensemble.prompts is not None:
        for record in store.evaluations(run_id=run_id):
            ensemble.prompts.errors.add(record)


def replay_config(
    config: RunConfig, recording: str | Path, manager: PluginManager | None = None, on_miss: str = "error"
) -> RunConfig:
    """``config`` with every language-model member replaced by a ``replay`` of its recorded calls."""
    manager = manager or get_plugin_manager()
    llms = []
    for choice, name in zip(config.llms, _member_names(config), strict=True):
        if calls_language_model(choice, manager) and choice.name != "replay":
            llms.append(
                {
                    "name": "replay",
                    "model": choice.model,
                    "weight": choice.weight,
                    "options": {
                        "recording": str(recording),
                        "member": name,
                        "on_miss": on_miss,
                        # requests split and sent as in the recorded run, so they have the same keys
                        "concurrency": dict(choice.options).get(
                            "concurrency", ProviderOptions.model_fields["concurrency"].default
                        ),
                    },
                }
            )
        else:
            llms.append(choice.model_dump())
    return config.model_copy(update={"llms": [type(config.llms[0]).model_validate(x) for x in llms]})
