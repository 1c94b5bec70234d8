"""One evaluator over several shape sets: a kernel is judged on every set of a multi-shape run."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kfoundry.core.models import Candidate, DeviceProfile, EvalRecord
from kfoundry.core.run.state import LoopError, RunEvaluator


class ShapeSetEvaluator:
    """Evaluates each candidate on several shape sets, one evaluator per set, and aggregates.

    A candidate is correct when it is correct on every set (evaluation stops at the first set it
    fails, whose record is returned); its speedup is the geometric mean of the sets' speedups and
    its timing the first set's. Each set's verdict is kept in ``record.resources["per_shape"]``.
    """

    def __init__(self, evaluators: list[RunEvaluator], shape_sets: list[dict[str, int | float]]) -> None:
        if not evaluators or len(evaluators) != len(shape_sets):
            raise LoopError("a multi-shape run needs one evaluator per shape set")
        self.evaluators, self.shape_sets = evaluators, shape_sets
        first = evaluators[0]
        self.problem, self.backend, self.config = first.problem, first.backend, first.config
        self.store, self.run_id = first.store, first.run_id

    @property
    def device(self) -> DeviceProfile:
        return self.evaluators[0].device

    @property
    def backend_name(self) -> str:
        return str(self.evaluators[0].backend_name)

    def evaluate(self, candidate: Candidate) -> EvalRecord:
        return self.evaluate_many([candidate])[0]

    def evaluate_many(
        self, candidates: list[Candidate], on_record: Callable[[int, EvalRecord], None] | None = None
    ) -> list[EvalRecord]:
        """Each shape set's evaluator gets every candidate still correct at once (concurrently where
        its executor allows); ``on_record(index, record)`` as each candidate's verdict is final."""
        per: list[list[EvalRecord]] = [[] for _ in candidates]
        out: list[EvalRecord | None] = [None] * len(candidates)
        alive = list(range(len(candidates)))
        for n, evaluator in enumerate(self.evaluators):
            last = n == len(self.evaluators) - 1

            def arrived(j: int, record: EvalRecord, ids: list[int] = alive, last: bool = last) -> None:
                i = ids[j]
                per[i].append(record)
                if last or not record.is_correct:
                    out[i] = final = self._aggregate(per[i])
                    if on_record is not None:
                        on_record(i, final)

            evaluator.evaluate_many([candidates[i] for i in alive], on_record=arrived)
            alive = [i for i in alive if out[i] is None]
        return [r for r in out if r is not None]

    def _aggregate(self, records: list[EvalRecord]) -> EvalRecord:
        per_shape = [
            {
                "shapes": dict(s),
                "outcome": r.outcome.value,
                "speedup": r.speedup,
                "eval_key": r.eval_key,
                "median_ms": r.timing.median_ms if r.timing else None,
                "reference_ms": r.reference_timing.median_ms if r.reference_timing else None,
            }
            for s, r in zip(self.shape_sets, records, strict=False)
        ]
        base = records[-1] if not records[-1].is_correct else records[0]
        speedups = [r.speedup for r in records]
        update: dict[str, Any] = {"resources": {**base.resources, "per_shape": per_shape}}
        if base.is_correct and all(x is not None and x > 0 for x in speedups):
            update["speedup"] = math.exp(sum(math.log(x) for x in speedups if x) / len(speedups))
            update["roofline_flag"] = any(r.roofline_flag for r in records)
        elif not base.is_correct and len(self.shape_sets) > 1:
            update["message"] = f"on shape set {self.shape_sets[len(records) - 1]}: {base.message}"
        return base.model_copy(update=update)
