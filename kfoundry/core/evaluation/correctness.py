"""Correctness trials: every variant and trial through the judge, verdicts in order."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import torch

from kfoundry.core.evaluation.jobs import EvalJob, JobResult
from kfoundry.core.evaluation.judge import (
    Judge,
    mark_aliasing,
    nbytes,
)
from kfoundry.core.evaluation.runner_handle import JobFailed
from kfoundry.core.evaluation.trials import TrialPlan, TrialSpec, domain_reason, transform_inputs
from kfoundry.core.evaluation.verifier import check_independence


def variant_index(note: str) -> int | None:
    head = note.split(":", 1)[0].removeprefix("variant ").strip()
    return int(head) if head.isdigit() else None


@dataclass
class Trial:
    variant: int
    distribution: str
    aligned: bool
    label: str


def _trial_list(job: EvalJob, plan: TrialPlan) -> list[Trial]:
    base = [Trial(0, "problem", True, f"trial {i}") for i in range(job.evaluation.trials)]
    structured = [
        Trial(s.variant, s.distribution, s.aligned, s.label or _spec_label(s)) for s in plan.structured
    ]
    return base + structured


def _spec_label(spec: TrialSpec) -> str:
    return f"variant {spec.variant}, {spec.distribution} inputs" + ("" if spec.aligned else ", unaligned")


def run_correctness(judge: Judge, plan: TrialPlan) -> str:
    """Every correctness trial; raises JobFailed at the first failure; returns a summary line."""
    ev = judge.job.evaluation
    trials = _trial_list(judge.job, plan)
    sizes: dict[tuple[int, bool], int] = {}
    sample_inputs: dict[int, list[Any]] = {}
    for v in judge.variants:
        sample_inputs[v.index] = v.problem.make_inputs(0, judge.device)
    for t in trials:
        key = (t.variant, t.aligned)
        sizes[key] = nbytes(sample_inputs[t.variant]) + 64 * (len(sample_inputs[t.variant]) + 1)
    judge.open_arena(sum(sizes.values()) + 4096)
    generator = torch.Generator().manual_seed(secrets.randbits(63))
    seeds: list[int] = []
    first: dict[int, tuple[list[Any], list[Any]]] = {}
    counts = {"trials": 0, "skipped": 0}
    kinds: set[str] = set()
    started = time.monotonic()
    extra = 0
    index = 0
    while True:
        if index < len(trials):
            trial = trials[index]
        elif extra < ev.max_trials - len(trials) and time.monotonic() - started < ev.correctness_budget_s:
            trial = Trial(0, "problem", True, f"extra trial {extra}")
            extra += 1
        else:
            break
        index += 1
        variant = judge.variants[trial.variant]
        if not variant.ok:
            continue
        seed = secrets.randbits(31)
        seeds.append(seed)
        inputs = variant.problem.make_inputs(seed, judge.device)
        inputs = transform_inputs(inputs, trial.distribution, generator)
        refs, ref64 = judge.reference(variant, inputs)
        mark_aliasing(refs, inputs)
        if trial.distribution not in ("problem", "nonfinite"):
            reason = domain_reason(refs, ref64)
            if reason is not None:
                counts["skipped"] += 1
                judge.log.append(f"{trial.label}: skipped ({reason})")
                continue
        key = (trial.variant, trial.aligned)
        if key not in judge.slot_keys:
            judge.slot_keys[key] = judge.add_slots([inputs], trial.aligned)[0]
        slot = judge.slot_keys[key]
        judge.write([slot], [inputs])
        where = f"{trial.label} ({variant.label})" if trial.variant else trial.label
        described, _, _ = judge.call(trial.variant, [slot], where, judge.device != "cpu")
        outs, verdict = judge.check_call(variant, slot, inputs, described[0], 0, refs, ref64)
        if verdict is not None:
            judge.log.insert(0, f"trial input seeds: {seeds}")
            raise JobFailed(JobResult(outcome=verdict.outcome, message=f"{where}: {verdict.message}"))
        counts["trials"] += 1
        if counts["trials"] == 1:  # the budget for extra trials starts once the kernels are compiled
            started = time.monotonic()
        kinds.add(trial.distribution + ("" if trial.aligned else " unaligned"))
        if trial.distribution == "problem" and outs is not None:
            if trial.variant not in first:
                first[trial.variant] = (outs, refs)
            else:
                verdict = check_independence([first[trial.variant][0], outs], [first[trial.variant][1], refs])
                if verdict is not None:
                    raise JobFailed(JobResult(outcome=verdict.outcome, message=f"{where}: {verdict.message}"))
    judge.log.insert(0, f"trial input seeds: {seeds}")
    shapes = [v.label for v in judge.variants if v.ok]
    if plan.fixed_shape_reason:
        judge.log.append(f"no other shapes tried: {plan.fixed_shape_reason}")
    fixed = f", fixed: {plan.fixed_shape_reason}" if plan.fixed_shape_reason else ""
    return (
        f"correct on {counts['trials']} trials ({len(shapes)} shape set{'s' if len(shapes) != 1 else ''}{fixed}; "
        f"inputs: {', '.join(sorted(kinds))})"
    )
