"""Kernels that are correct at any shape: the example seeds and the offline generator's recipes are judged
``correct`` by the Evaluator at the small default shapes, at a tiny variant (sizes below a work-group or a
vector width) and at a ragged one (sizes off every multiple of 4/8/16/32/64), with ModelNew rebuilt for
each variant; generated sources carry no problem size; unaligned and special-valued inputs match torch."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch
from eval_helpers import EXAMPLES, SMALL_SHAPES, fast_config

from kfoundry.core.evaluation import Evaluator
from kfoundry.core.generator import ProblemSummary
from kfoundry.core.models import Candidate, Outcome
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

KB = EXAMPLES / "kernelbench"
WORKERS = 1

#: Size constants (>= 16 at the small shapes) of each example at a tiny and at a ragged variant.
VARIANTS: dict[str, dict[str, dict[str, int]]] = {
    "vector_add": {"tiny": {"N": 13}, "ragged": {"N": 195}},
    "gelu": {"tiny": {"N": 11}, "ragged": {"N": 299}},
    "softmax": {"tiny": {"dim": 7}, "ragged": {"dim": 195}},
    "layer_norm": {"tiny": {"features": 11}, "ragged": {"features": 131}},
    "rms_norm": {"tiny": {"features": 13}, "ragged": {"features": 67}},
    "matmul": {"tiny": {"M": 7, "K": 11, "N": 13}, "ragged": {"M": 67, "K": 131, "N": 195}},
    "sum_reduction": {"tiny": {"dim1": 7, "dim2": 11}, "ragged": {"dim1": 67, "dim2": 131}},
    "depthwise_conv2d": {"tiny": {"height": 7, "width": 11}, "ragged": {"height": 67, "width": 131}},
    # head_dim stays even (the reference splits it in halves); half = 5 and 67 leave vector tails
    "rotary_embedding": {"tiny": {"seq_len": 7, "head_dim": 10}, "ragged": {"seq_len": 67, "head_dim": 134}},
}


def _summary(name: str, shapes: dict[str, int]) -> ProblemSummary:
    return ProblemSummary(
        name=name,
        reference_source=(KB / f"{name}.py").read_text(),
        shapes=shapes,
        path=str(KB / f"{name}.py"),
    )


def _candidates(name: str) -> list[Candidate]:
    """The seed (and improved) kernels, and the offline recipes of the two highest ranks (at their defaults)."""
    out = [
        Candidate(source=p.read_text(), label=p.name)
        for p in (KB / "seeds" / f"{name}_opencl.py", KB / "improved" / f"{name}_opencl.py")
        if p.exists()
    ]
    recipes = OfflineGenerator().recipes(_summary(name, SMALL_SHAPES[name]), "opencl")
    ranks = sorted({r.rank for r in recipes})[-2:]
    return out + [r.candidate() for r in recipes if r.rank in ranks]


#: Problems checked in the default run; the others (about 3 minutes) are slow-marked and run by .ci/run.
DEFAULT_SHAPE_GENERIC = {"vector_add"}


@pytest.mark.parametrize(
    "name",
    [
        n if n in DEFAULT_SHAPE_GENERIC else pytest.param(n, marks=pytest.mark.slow)
        for n in sorted(SMALL_SHAPES)
    ],
)
def test_seeds_and_recipes_are_correct_at_tiny_and_ragged_shapes(name: str, tmp_path: Path) -> None:
    candidates = _candidates(name)
    for variant, sizes in [("default", {}), *VARIANTS[name].items()]:
        problem = load_problem(KB / f"{name}.py", {**SMALL_SHAPES[name], **sizes})
        config = fast_config(
            tmp_path, cache=False, trials=2, max_repeats=3, target_time_s=0.001, shape_variants=0
        )
        config.executor.options["workers"] = WORKERS
        with Evaluator(problem, config) as evaluator:
            records = evaluator.evaluate_many(candidates)
        for cand, rec in zip(candidates, records, strict=True):
            assert rec.outcome is Outcome.correct, (
                f"{name} {variant} {cand.label}: {rec.message}\n{rec.log[-1500:]}"
            )


#: Distinct sizes no template parameter uses: a generated source that bakes a size in contains one.
ODD_SHAPES: dict[str, dict[str, int]] = {
    "vector_add": {"N": 1237},
    "gelu": {"N": 1237},
    "softmax": {"batch_size": 37, "dim": 211},
    "layer_norm": {"batch_size": 37, "features": 211},
    "rms_norm": {"batch_size": 37, "features": 211},
    "matmul": {"M": 37, "K": 53, "N": 71},
    "sum_reduction": {"batch_size": 3, "dim1": 37, "dim2": 53},
    "depthwise_conv2d": {"batch_size": 1, "channels": 3, "height": 37, "width": 53},
    "rotary_embedding": {"batch_size": 1, "seq_len": 37, "heads": 3, "head_dim": 106},
}


@pytest.mark.parametrize("language", ["opencl", "cuda", "sycl"])
def test_generated_sources_carry_no_problem_size(language: str) -> None:
    gen = OfflineGenerator()
    for name, shapes in ODD_SHAPES.items():
        sizes = {v for v in shapes.values() if v >= 16} | {shapes.get("head_dim", 0) // 2} - {0}
        for recipe in gen.recipes(_summary(name, shapes), language):
            text = recipe.kernel + recipe.forward + "".join(recipe.modules)
            found = [s for s in sizes if re.search(rf"(?<![\w.]){s}(?![\w.])", text)]
            assert not found, f"{name} {recipe.name} ({language}) contains the size(s) {found}"


# -- unaligned and special-valued inputs, in process (fast) ----------------------------------------------


def _reference(name: str, shapes: dict[str, int]) -> types.ModuleType:
    module = types.ModuleType(name)
    exec((KB / f"{name}.py").read_text(), module.__dict__)
    for k, v in shapes.items():
        setattr(module, k, v)
    return module


def _unaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` whose first element is one float past a 64-byte boundary."""
    buf = torch.empty(t.numel() + 16)
    start = (16 - (buf.data_ptr() % 64) // 4) % 16 + 1
    out = buf[start : start + t.numel()].view(t.shape)
    out.copy_(t)
    assert out.data_ptr() % 64 == 4
    return out


def _special(t: torch.Tensor, kind: str, gen: torch.Generator) -> torch.Tensor:
    t = torch.rand(t.shape, generator=gen) * 2 - 1
    if kind == "large":
        return t * 1e4
    if kind == "tiny":
        return t * 1e-20
    flat = t.reshape(-1).clone()
    idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=gen)
    flat[idx[0::3]] = float("nan")
    flat[idx[1::3]] = float("inf")
    flat[idx[2::3]] = -float("inf")
    return flat.view(t.shape)


#: Absolute tolerance per input kind: float32 rounding of sums of about 100 values of that magnitude.
ATOL = {"specials": 1e-5, "large": 5e-2, "tiny": 1e-25}


def _run(source: str, params: dict, ref: types.ModuleType, inputs: list[torch.Tensor]) -> torch.Tensor:
    from kfoundry.runtime import synchronize

    namespace: dict = {"PARAMS": params, "__name__": "candidate"}
    exec(compile(source, "candidate", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*ref.get_init_inputs())
    out = model(*inputs)
    synchronize()
    return out


@pytest.mark.parametrize("name", ["vector_add", "gelu", "softmax", "layer_norm", "rms_norm", "sum_reduction"])
def test_unaligned_and_special_inputs_match_torch(name: str) -> None:
    """Every OpenCL recipe at a ragged shape, on inputs one float off 64-byte alignment, with NaN/+-inf,
    x1e4 and x1e-20 values: NaN where torch has NaN, infinities equal, the rest within 1e-4 / few ulps."""
    shapes = {**SMALL_SHAPES[name], **VARIANTS[name]["ragged"]}
    ref = _reference(name, shapes)
    torch.manual_seed(0)
    model = ref.Model(*ref.get_init_inputs())
    gen = torch.Generator().manual_seed(1)
    sources = [
        OfflineGenerator().recipes(_summary(name, shapes), "opencl"),
        [
            p
            for p in (KB / "seeds" / f"{name}_opencl.py", KB / "improved" / f"{name}_opencl.py")
            if p.exists()
        ],
    ]
    for kind in ("specials", "large", "tiny"):
        inputs = [_unaligned(_special(x, kind, gen)) for x in ref.get_inputs()]
        with torch.no_grad():
            expected = model(*[x.clone() for x in inputs])
        for recipe in sources[0]:
            out = _run(recipe.render(), dict(recipe.defaults), ref, inputs)
            torch.testing.assert_close(
                out,
                expected,
                rtol=1e-4,
                atol=ATOL[kind],
                equal_nan=True,
                msg=lambda m, r=recipe.name, k=kind: f"{r} {k}: {m}",
            )
        for path in sources[1]:
            out = _run(path.read_text(), {}, ref, inputs)
            torch.testing.assert_close(
                out,
                expected,
                rtol=1e-4,
                atol=ATOL[kind],
                equal_nan=True,
                msg=lambda m, r=path.name, k=kind: f"{r} {k}: {m}",
            )
