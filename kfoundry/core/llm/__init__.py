"""Language-model support: prompts, reply parsing, cost caps, retries, recording, meta-prompting.

Providers (``kfoundry.plugins.llms``) subclass :class:`~kfoundry.core.llm.provider.LLMProvider`;
:func:`kfoundry.core.ensemble.build_ensemble` combines them.
"""

from __future__ import annotations

from kfoundry.core.llm.cost import CostLedger, LLMBudgetExhausted, Price
from kfoundry.core.llm.provider import LLMError, LLMProvider, ProviderOptions

__all__ = ["CostLedger", "LLMBudgetExhausted", "LLMError", "LLMProvider", "Price", "ProviderOptions"]
