"""The evaluation pipeline: static checks → compile → correctness → timing, each candidate in a
sandboxed worker process, results cached in the store.

Public API: :class:`Evaluator` (``evaluate``, ``evaluate_many``, ``reference_timing``, ``device``,
``backend_name``, ``close``), :class:`Executor` (the executor plugin contract), :class:`EvalJob`,
:class:`JobResult` and :func:`run_sandboxed` (what an executor calls per job).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kfoundry.core.evaluation.executor import Executor
from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.evaluation.sandbox import run_sandboxed

if TYPE_CHECKING:
    from kfoundry.core.evaluation.evaluator import EvaluationError, Evaluator

__all__ = ["EvalJob", "EvaluationError", "Evaluator", "Executor", "JobResult", "run_sandboxed"]


def __getattr__(name: str) -> Any:
    """``Evaluator`` and ``EvaluationError`` on first use: they import torch, which executor plugins
    (loaded by every ``kf-run`` command) need not pay for."""
    if name in ("Evaluator", "EvaluationError"):
        from kfoundry.core.evaluation import evaluator

        return getattr(evaluator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
