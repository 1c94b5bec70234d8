"""Ensembles of generators: ``sample`` (weighted choice), ``bandit`` (UCB on fitness gain per unit
cost) and ``vote`` (every member proposes ``ceil(n / members)``, every member ranks the pool, a
Borda count keeps ``min(n, keep)``, so device time goes to what the ensemble agrees on).

:func:`build_ensemble` turns ``config.llms`` into one :class:`Ensemble` (itself a ``Generator``)
sharing one cost ledger (the run's token and money caps), one recorder (every call to the store
and ``llm_calls.jsonl``), a prompt archive with meta-prompting, and a novelty filter. The ensemble
learns from results through :meth:`Ensemble.observe` and :meth:`Ensemble.end_generation`; it also
registers itself for the ``kf_candidate_evaluated`` / ``kf_generation_finished`` hooks, so a loop
that calls those hooks needs nothing else. Once the LLM caps are reached it proposes nothing more
and says why in :attr:`Ensemble.stop_reason`.
"""

from kfoundry.core.ensemble.build import build_ensemble, calls_language_model, replay_config
from kfoundry.core.ensemble.members import FREE_COST, Ensemble, Member, borda, proposal_cost

__all__ = [
    "FREE_COST",
    "Ensemble",
    "Member",
    "borda",
    "build_ensemble",
    "calls_language_model",
    "proposal_cost",
    "replay_config",
]
