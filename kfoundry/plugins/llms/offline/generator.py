"""The offline generator: proposals from the cookbook, steered by the search's request.

Moves: *create* (a recipe near the target cell), *improve* (a neighbouring parameter setting of the
parent's recipe, or a step to a recipe nearer the target cell / higher on the optimisation ladder),
*crossover* (the parent's recipe with parameters taken from a second parent), *repair* (the parent's
recipe with safe defaults, or a simpler recipe). Recognising the problem needs no language model.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from kfoundry.core.behaviour.run import extractor_for_request
from kfoundry.core.descriptors import DescriptorExtractor
from kfoundry.core.generator import GenerationRequest, Generator, GeneratorUnsupported, ProblemSummary
from kfoundry.core.models import Candidate, Outcome, ParamValue, Proposal, stable_hash
from kfoundry.plugins.llms.offline import (
    cookbook_conv_rotary,
    cookbook_elementwise,
    cookbook_graph,
    cookbook_matmul,
    cookbook_rows,
)
from kfoundry.plugins.llms.offline.options import OfflineOptions
from kfoundry.plugins.llms.offline.recipe import Recipe, sycl_recipe
from kfoundry.plugins.llms.offline.recognize import OpSpec, recognize

_COOKBOOKS = {
    "elementwise": cookbook_elementwise,
    "matmul": cookbook_matmul,
    "gemm": cookbook_matmul,
    "softmax": cookbook_rows,
    "log_softmax": cookbook_rows,
    "layer_norm": cookbook_rows,
    "rms_norm": cookbook_rows,
    "reduce": cookbook_rows,
    "depthwise_conv2d": cookbook_conv_rotary,
    "rotary": cookbook_conv_rotary,
    "graph": cookbook_graph,
}


def valid(params: dict[str, ParamValue], restrictions: list[str], device: Any = None) -> bool:
    """Whether ``params`` satisfy every restriction expression."""
    env = {"__builtins__": {"min": min, "max": max, "abs": abs}, "device": device, "math": math, **params}
    try:
        return all(bool(eval(expr, env)) for expr in restrictions)  # noqa: S307 - cookbook-authored expressions
    except Exception:
        return False


class OfflineGenerator(Generator):
    """Cookbook proposals for recognised operation families, in OpenCL and CUDA (and SYCL, translated from OpenCL)."""

    name = "offline"

    def __init__(self, options: OfflineOptions | None = None) -> None:
        self.opts = options or OfflineOptions()
        self._specs: dict[str, OpSpec] = {}
        self._recipes: dict[tuple[str, str], list[Recipe]] = {}
        self._cells: dict[tuple[str, str, str], tuple[int, ...]] = {}
        self._failed: dict[str, set[tuple[str, str]]] = {}

    # -- cookbook access -------------------------------------------------------------------------------

    def spec(self, problem: ProblemSummary) -> OpSpec:
        key = stable_hash(problem.reference_source, problem.shapes)
        if key not in self._specs:
            self._specs[key] = recognize(problem)
        return self._specs[key]

    def recipes(self, problem: ProblemSummary, language: str) -> list[Recipe]:
        """Every recipe for ``problem`` in ``language`` (GeneratorUnsupported if none)."""
        key = (stable_hash(problem.reference_source, problem.shapes), language)
        if key not in self._recipes:
            if language not in ("opencl", "cuda", "sycl", "triton"):
                raise GeneratorUnsupported(f"offline generator: no cookbook for language {language!r}")
            spec = self.spec(problem)
            if (
                language == "triton"
            ):  # Python kernels: their own recipes (kfoundry/plugins/llms/offline/triton_*)
                from kfoundry.plugins.llms.offline.triton_recipes import recipes as triton_recipes

                cookbook = triton_recipes(spec)
            elif (
                language == "sycl"
            ):  # the OpenCL recipes, translated (split rows: barrier-bound on CPU devices)
                found = [
                    sycl_recipe(r)
                    for r in _COOKBOOKS[spec.family].recipes(spec, "opencl")
                    if not r.name.endswith("/split_rows")
                ]
                cookbook = [r for r in found if r is not None]
            else:
                cookbook = _COOKBOOKS[spec.family].recipes(spec, language)
                gemv = cookbook_rows.gemv_rows(spec) if language == "cuda" else None
                if gemv is not None:  # a matrix-vector product is a row reduction
                    cookbook = [*cookbook, gemv]
            usable = [_with_valid_defaults(r) for r in cookbook]
            self._recipes[key] = [r for r in usable if r is not None]
            if not self._recipes[key]:
                raise GeneratorUnsupported(
                    f"offline generator: no recipe fits problem {problem.name!r} at these shapes"
                )
        return self._recipes[key]

    def cell(self, recipe: Recipe, extractor: DescriptorExtractor) -> tuple[int, ...]:
        key = (recipe.name, recipe.language, stable_hash(recipe.kernel))
        if key not in self._cells:
            self._cells[key] = extractor.cell(recipe.render())
        return self._cells[key]

    def check(self, problem: ProblemSummary, language: str) -> None:
        """Raise :class:`GeneratorUnsupported` (one line) unless the cookbook has a recipe for ``problem``:
        the recognition entry point ``kf-run`` calls before it creates a run folder (traces on the meta
        device, so nothing full-size is allocated)."""
        self.recipes(problem, language)

    # -- the generator contract ------------------------------------------------------------------------

    def seeds(self, request: GenerationRequest) -> list[Proposal]:
        """One proposal per recipe with its default parameters, lowest rank first (spans the grid).

        Without a seed file (``seeds/<stem>_<language>.py``) the naive recipe is the run's seed
        (``meta["seed"]``), so the run reports its speedup over it."""
        recipes = sorted(self.recipes(request.problem, request.language), key=lambda r: r.rank)
        out = [self._proposal(r, dict(r.defaults), "cookbook default") for r in recipes[: request.n]]
        if out and out[0].candidate is not None and not _has_seed_file(request):
            out[0].candidate.meta["seed"] = True
            out[0].rationale += " (the naive seed: the run's speedup is reported over it)"
        return out

    def _note_failures(self, request: GenerationRequest) -> set[tuple[str, str]]:
        """(recipe, parameters) pairs that failed correctness at this shape, as far as requests told."""
        key = stable_hash(request.problem.reference_source, request.problem.shapes, request.language)
        failed = self._failed.setdefault(key, set())
        for attempt in [request.parent, *request.inspirations]:
            if attempt is None or attempt.record is None or attempt.record.outcome is not Outcome.mismatch:
                continue
            recipe = attempt.candidate.meta.get("recipe")
            if recipe:
                failed.add((str(recipe), stable_hash(attempt.candidate.params)))
        return failed

    def propose(self, request: GenerationRequest) -> list[Proposal]:
        recipes = self.recipes(request.problem, request.language)
        failed = self._note_failures(request)
        # a recipe that failed correctness at its defaults here is numerically unfit: leave it out
        unfit = {r.name for r in recipes if (r.name, stable_hash(dict(r.defaults))) in failed}
        recipes = [r for r in recipes if r.name not in unfit] or recipes
        extractor = extractor_for_request(request)  # the run's descriptor space
        rng = random.Random(f"{request.seed}:{request.generation}:{request.extra.get('index', 0)}")
        avoid = set(request.extra.get("avoid", []))
        out: list[Proposal] = []
        for _ in range(request.n):
            proposal = None
            for _ in range(self.opts.max_tries):
                recipe, params, why = self._move(request, recipes, extractor, rng)
                cand = recipe.candidate(params)
                if cand.content_hash not in avoid and (recipe.name, stable_hash(cand.params)) not in failed:
                    proposal = self._proposal(recipe, params, why, request)
                    break
            if proposal is None:  # the neighbourhood is exhausted: sample the whole cookbook
                recipe = rng.choice(recipes)
                params = self._random_params(recipe, rng, request)
                proposal = self._proposal(recipe, params, "random restart", request)
            avoid.add(proposal.candidate.content_hash)  # type: ignore[union-attr]
            out.append(proposal)
        return out

    def rank(self, request: GenerationRequest, proposals: list[Proposal]) -> list[float] | None:
        """Prefer proposals higher on the cookbook's optimisation ladder."""
        return [float(p.candidate.meta.get("rank", 0)) if p.candidate else -1.0 for p in proposals]

    # -- moves -------------------------------------------------------------------------------------------

    def _move(
        self,
        request: GenerationRequest,
        recipes: list[Recipe],
        extractor: DescriptorExtractor,
        rng: random.Random,
    ) -> tuple[Recipe, dict[str, ParamValue], str]:
        by_name = {r.name: r for r in recipes}
        parent = request.parent.candidate if request.parent else None
        parent_recipe = by_name.get(str(parent.meta.get("recipe"))) if parent is not None else None
        if request.extra.get("random") or parent is None:
            if request.target_cell is not None and not request.extra.get("random"):
                recipe = self._nearest(recipes, request.target_cell, extractor, rng)
                return recipe, self._params_for(recipe, rng, request, fresh=True), "aimed at the target cell"
            recipe = rng.choice(recipes)
            if parent_recipe is not None and rng.random() < 0.5:
                recipe = parent_recipe
            return recipe, self._random_params(recipe, rng, request), "random sample"
        if parent_recipe is None:  # a seed or an LLM kernel: start climbing the ladder
            recipe = (
                self._nearest(recipes, request.target_cell, extractor, rng)
                if request.target_cell
                else min(recipes, key=lambda r: (r.rank == 0, rng.random()))
            )
            return recipe, dict(recipe.defaults), f"cookbook step from {parent.label or 'the parent'}"
        if request.mode == "repair":
            if parent.params != {k: v for k, v in parent_recipe.defaults.items() if k in parent.params}:
                return parent_recipe, dict(parent_recipe.defaults), "repair: back to safe defaults"
            simpler = [r for r in recipes if r.rank < parent_recipe.rank] or recipes
            recipe = rng.choice(simpler)
            return recipe, dict(recipe.defaults), "repair: a simpler recipe"
        other = request.inspirations[0].candidate if request.inspirations else None
        if request.extra.get("crossover") and other is not None:
            params = {**parent.params}
            for k, v in other.params.items():
                if (
                    k in parent_recipe.space.params
                    and v in parent_recipe.space.params[k]
                    and rng.random() < 0.5
                ):
                    params[k] = v
            if valid(params, parent_recipe.space.restrictions, request.device):
                return parent_recipe, params, "crossover of two parents' parameters"
        parent_cell = self.cell(parent_recipe, extractor)
        wants_step = request.target_cell is not None and tuple(request.target_cell) != parent_cell
        if (wants_step and rng.random() < 0.7) or rng.random() < self.opts.step_probability:
            if wants_step:
                recipe = self._nearest(
                    [r for r in recipes if r is not parent_recipe] or recipes,
                    request.target_cell,
                    extractor,
                    rng,
                )
            else:
                higher = [r for r in recipes if r.rank > parent_recipe.rank]
                recipe = rng.choice(higher) if higher else rng.choice(recipes)
            return (
                recipe,
                self._params_for(recipe, rng, request, fresh=True),
                f"step {parent_recipe.name} -> {recipe.name}",
            )
        return (
            parent_recipe,
            self._mutate(parent_recipe, dict(parent.params), rng, request),
            "parameter mutation",
        )

    def _nearest(
        self,
        recipes: list[Recipe],
        target: tuple[int, ...] | None,
        extractor: DescriptorExtractor,
        rng: random.Random,
    ) -> Recipe:
        if target is None:
            return rng.choice(recipes)
        dist = {
            r.name: sum(abs(a - b) for a, b in zip(self.cell(r, extractor), target, strict=False))
            for r in recipes
        }
        best = min(dist.values())
        return rng.choice([r for r in recipes if dist[r.name] == best])

    def _params_for(
        self, recipe: Recipe, rng: random.Random, request: GenerationRequest, fresh: bool
    ) -> dict[str, ParamValue]:
        return (
            dict(recipe.defaults)
            if fresh and rng.random() < 0.6
            else self._random_params(recipe, rng, request)
        )

    def _random_params(
        self, recipe: Recipe, rng: random.Random, request: GenerationRequest
    ) -> dict[str, ParamValue]:
        for _ in range(200):
            params = {k: rng.choice(v) for k, v in recipe.space.params.items()}
            if valid(params, recipe.space.restrictions, request.device) and _fits(params, request):
                return params
        return dict(recipe.defaults)

    def _mutate(
        self, recipe: Recipe, params: dict[str, ParamValue], rng: random.Random, request: GenerationRequest
    ) -> dict[str, ParamValue]:
        names = [k for k, v in recipe.space.params.items() if len(v) > 1]
        if not names:
            return params
        for _ in range(50):
            new = dict(params)
            for name in rng.sample(names, min(len(names), rng.randint(1, self.opts.mutations))):
                values = recipe.space.params[name]
                idx = values.index(new[name]) if new.get(name) in values else 0
                step = rng.choice([-1, 1]) * (2 if rng.random() < 0.2 else 1)
                new[name] = values[min(max(idx + step, 0), len(values) - 1)]
            if (
                new != params
                and valid(new, recipe.space.restrictions, request.device)
                and _fits(new, request)
            ):
                return new
        return self._random_params(recipe, rng, request)

    def _proposal(
        self,
        recipe: Recipe,
        params: dict[str, ParamValue],
        why: str,
        request: GenerationRequest | None = None,
    ) -> Proposal:
        cand: Candidate = recipe.candidate(params)
        return Proposal(
            candidate=cand,
            generator=self.name,
            rationale=f"{recipe.name}: {why}",
            prompt_id=request.prompt_id if request else None,
        )


def _with_valid_defaults(recipe: Recipe) -> Recipe | None:
    """``recipe`` with defaults that satisfy its restrictions at these shapes (None if nothing does)."""
    if valid(recipe.defaults, recipe.space.restrictions):
        return recipe
    names = list(recipe.space.params)
    for values in itertools.product(*(recipe.space.params[n] for n in names)):
        params = dict(zip(names, values, strict=True))
        if valid(params, recipe.space.restrictions):
            recipe.defaults = params
            return recipe
    return None


def _has_seed_file(request: GenerationRequest) -> bool:
    """Whether the problem has a naive seed kernel by the examples' convention (the loop then seeds with it)."""
    from pathlib import Path

    from kfoundry.core.loop import find_seed_kernel

    path = request.problem.path
    return bool(path) and find_seed_kernel(Path(str(path)), request.language) is not None


def _fits(params: dict[str, ParamValue], request: GenerationRequest) -> bool:
    """The work-group implied by the usual block parameter names fits the device."""
    limit = request.device.max_work_group_size
    if not limit:
        return True
    size = 1
    for name in ("BLOCK_X", "BLOCK_Y", "BLOCK", "BI", "BR"):
        value = params.get(name)
        if isinstance(value, int):
            size *= value
    return size <= limit
