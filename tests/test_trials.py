"""Trial planning: alternative sizes validated on the meta device, input distributions, alignment, domain."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kfoundry.core.evaluation.trials import (
    DISTRIBUTIONS,
    domain_reason,
    plan_trials,
    transform_inputs,
    unaligned_copy,
)
from kfoundry.core.problem import as_tensor_list, load_problem

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted((ROOT / "examples" / "kernelbench").glob("*.py"))
MAX_ELEMENTS = 1 << 16


def _size_constants(shapes: dict[str, int | float]) -> dict[str, int]:
    return {k: v for k, v in shapes.items() if isinstance(v, int) and v >= 16}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_gets_a_valid_alternative_size(path: Path) -> None:
    problem = load_problem(path)
    plan = plan_trials(problem, MAX_ELEMENTS)
    assert plan.variants[0] == problem.shapes and plan.fixed_shape_reason is None
    assert 2 <= len(plan.variants) <= 3
    sizes = _size_constants(problem.shapes)
    out0 = [o.shape for o in as_tensor_list(problem.make_reference()(*problem.make_inputs(0)))]
    for i, variant in enumerate(plan.variants[1:], start=1):
        assert {k for k in variant if variant[k] != problem.shapes[k]} == set(sizes)
        label = next(s.label for s in plan.structured if s.variant == i)
        changed = [int(variant[k]) for k in sizes]
        if "tiny:" in label:
            assert all(v < 32 and (v % 2 == 1 or v % 4 == 2) for v in changed)
            assert len(set(changed)) == len(changed)
        else:
            assert "ragged:" in label
            assert all(v % 4 != 0 and v <= min(sizes[k], 300) for v, k in zip(changed, sizes, strict=True))
        alt = load_problem(path, variant)
        inputs = alt.make_inputs(0)
        assert sum(t.numel() for t in inputs if isinstance(t, torch.Tensor)) <= MAX_ELEMENTS
        outputs = as_tensor_list(alt.make_reference()(*inputs))  # runs on the CPU
        assert all(torch.isfinite(o).all() for o in outputs)
        assert [o.shape for o in outputs] != out0


def test_structured_trials_cover_distributions_and_alignment() -> None:
    plan = plan_trials(load_problem(ROOT / "examples" / "kernelbench" / "matmul.py"), MAX_ELEMENTS)
    first = [(s.distribution, s.aligned) for s in plan.structured if s.variant == 0]
    assert first == [(d, True) for d in DISTRIBUTIONS[1:]] + [("problem", False)]
    for i in range(1, len(plan.variants)):
        assert [(s.distribution, s.aligned) for s in plan.structured if s.variant == i] == [
            ("problem", True),
            ("problem", False),
        ]
    assert all(s.label and "\n" not in s.label for s in plan.structured)
    assert plan.structured[-1].label == (
        "variant 2 (ragged: M=131, K=191, N=187), problem inputs, start 4 bytes off alignment"
    )
    assert plan.structured[0].label == "variant 0 (as configured), signed inputs"


DERIVED = """
import torch
import torch.nn as nn

batch_size = 4
channels = 32
size = 16
bias_shape = (channels, 1, 1)


class Model(nn.Module):
    def __init__(self, bias_shape):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return x + self.bias


def get_inputs():
    return [torch.rand(batch_size, channels, size, size)]


def get_init_inputs():
    return [bias_shape]
"""


def test_a_tuple_derived_from_a_size_follows_the_variants(tmp_path: Path) -> None:
    """``bias_shape = (channels, 1, 1)`` is recomputed when a variant changes ``channels`` (the problem
    loader re-runs the module with the override), so the derived shape sets stay usable."""
    path = tmp_path / "derived.py"
    path.write_text(DERIVED)
    plan = plan_trials(load_problem(path), MAX_ELEMENTS)
    assert len(plan.variants) == 3 and plan.fixed_shape_reason is None
    for shapes in plan.variants[1:]:
        problem = load_problem(path, shapes)
        assert problem.module.bias_shape == (shapes["channels"], 1, 1)
        problem.make_reference()(*problem.make_inputs(0, "cpu"))  # the reference runs at the variant


def test_fixed_shapes_say_why(tmp_path: Path) -> None:
    small = tmp_path / "small.py"
    small.write_text(DERIVED.replace("channels = 32", "channels = 3").replace("size = 16", "size = 8"))
    assert plan_trials(load_problem(small)).fixed_shape_reason == "no size constant >= 16"
    native = plan_trials(load_problem(ROOT / "examples" / "native" / "vector_add.toml"))
    assert len(native.variants) == 1 and native.fixed_shape_reason and "native" in native.fixed_shape_reason


def _inputs() -> list[object]:
    g = torch.Generator().manual_seed(0)
    return [torch.rand(64, 50, generator=g) * 3, torch.arange(10), torch.rand(40, generator=g).half(), 5]


def _draw(distribution: str, seed: int = 1, inputs: list[object] | None = None) -> list[object]:
    return transform_inputs(inputs or _inputs(), distribution, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_transforms_are_deterministic_and_keep_the_layout(distribution: str) -> None:
    inputs = _inputs()
    a, b, c = (_draw(distribution, seed, inputs) for seed in (1, 1, 2))
    for x, y, z, w in zip(inputs, a, b, c, strict=True):
        if not isinstance(x, torch.Tensor):
            assert y == x
            continue
        assert isinstance(y, torch.Tensor) and isinstance(z, torch.Tensor) and isinstance(w, torch.Tensor)
        assert (y.shape, y.dtype, y.device) == (x.shape, x.dtype, x.device)
        assert torch.equal(torch.nan_to_num(y), torch.nan_to_num(z))
        if not x.dtype.is_floating_point or distribution == "problem":
            assert y is x
        elif distribution != "nonfinite":
            assert not torch.equal(y, w)  # the generator decides the values


def test_distribution_properties() -> None:
    x = _inputs()[0]
    assert isinstance(x, torch.Tensor)
    scale = float(x.abs().max())
    signed, normal, large, tiny, nonfinite = (_draw(d)[0] for d in DISTRIBUTIONS[1:])
    assert isinstance(signed, torch.Tensor) and float(signed.min()) < 0 < float(signed.max())
    assert float(signed.abs().max()) <= scale and float(signed.abs().max()) > scale / 2
    assert isinstance(normal, torch.Tensor) and abs(float(normal.mean())) < 0.2 * scale
    assert 0.8 * scale < float(normal.std()) < 1.2 * scale
    assert isinstance(large, torch.Tensor) and 1e3 * scale < float(large.abs().max()) < 1e5 * scale
    assert isinstance(tiny, torch.Tensor) and float(tiny.abs().max()) < 1e-19 * scale
    assert float(tiny.abs()[tiny != 0].min()) >= torch.finfo(torch.float32).tiny  # normal numbers
    assert isinstance(nonfinite, torch.Tensor)
    nan, pinf, ninf = (
        int(nonfinite.isnan().sum()),
        int((nonfinite == math.inf).sum()),
        int((nonfinite == -math.inf).sum()),
    )
    assert nan >= 1 and pinf >= 1 and ninf >= 1 and nan + pinf + ninf <= max(3, x.numel() // 1000)
    keep = torch.isfinite(nonfinite)
    assert torch.equal(nonfinite[keep], x[keep])
    half_large = _draw("large")[2]
    assert isinstance(half_large, torch.Tensor) and bool(torch.isfinite(half_large).all())
    assert float(half_large.abs().max()) > 10
    with pytest.raises(ValueError, match="unknown distribution"):
        transform_inputs([x], "uniform", torch.Generator())


@pytest.mark.parametrize(("dtype", "offset"), [(torch.float32, 1), (torch.float16, 3), (torch.float64, 2)])
def test_unaligned_copy(dtype: torch.dtype, offset: int) -> None:
    t = torch.rand(3, 5, 7).to(dtype)
    u = unaligned_copy(t, offset)
    assert u.data_ptr() % 64 == offset * t.element_size()
    assert u.is_contiguous() and u.shape == t.shape and torch.equal(u, t)


def test_domain_reason_flags_overflow_and_ill_conditioning() -> None:
    x = _draw("large")[0]
    assert isinstance(x, torch.Tensor)
    reason = domain_reason([torch.exp(x)], [torch.exp(x.double())])
    assert reason is not None and reason.startswith("output 0: the float32 reference is not finite")
    assert domain_reason([torch.softmax(x, 1)], [torch.softmax(x.double(), 1)]) is None
    small = _draw("signed")[0]
    assert isinstance(small, torch.Tensor)
    cancel = [(small + 1e7) - 1e7], [(small.double() + 1e7) - 1e7]
    reason = domain_reason(*cancel)
    assert reason is not None and "ill-conditioned" in reason
    both = torch.tensor([math.nan, math.inf, 1.0])
    assert domain_reason([both], [both.double()]) is None  # non-finite in both: the judge's concern
    assert (
        domain_reason([torch.tensor([1.0, 2.0])], [torch.tensor([1.0, math.inf], dtype=torch.float64)])
        is not None
    )
    assert domain_reason([torch.exp(x)], None) is None
